//! The web console at `/ui`: the daemon's sandboxes, fork tree, images and host, live, with
//! the actions of the API. Served on the daemon's own listeners ahead of the API's checks, with
//! checks of its own:
//!
//! - On the Unix socket its mode (0600) is the check, as for the API.
//! - On TCP a bearer token is exchanged once, on the login page, for a session cookie
//!   (`HttpOnly; SameSite=Strict; Path=/ui`); every page, the event stream and every call need it.
//! - Actions are the API's own routes under `/ui/api/` (the same operations, the same errors):
//!   one that changes anything needs the session's CSRF token in `X-Forkbox-CSRF` (which a
//!   form on another page cannot send), and an `Origin`, when sent, of this daemon.
//! - Pages are the project's own HTML, CSS and JavaScript, embedded in the binary, under a
//!   Content-Security-Policy of `'self'` alone: nothing is fetched from elsewhere.

mod assets;
mod live;
mod session;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use forkbox_engine::api::{Code, Engine};
use tower::ServiceExt;

use crate::auth::Gate;
pub use live::Series;
use session::Sessions;

/// The header an action carries its session's CSRF token in.
pub const CSRF_HEADER: &str = "x-forkbox-csrf";
/// The session cookie's name.
pub const COOKIE: &str = "forkbox_console";
/// The longest login form read.
const MAX_LOGIN_BYTES: usize = 4096;

/// The console of one daemon: its sessions, the API it acts through, its host figures.
pub struct Console {
    engine: Arc<Engine>,
    /// Where it reads what it lists (on a cluster's node: every node's, through `api`).
    source: live::Source,
    /// The API (with the cluster's routing when in one), without the TCP listener's checks.
    api: Router,
    sessions: Sessions,
    series: Arc<Series>,
}

/// How a listener's requests reach the console.
#[derive(Clone)]
pub struct Access {
    console: Arc<Console>,
    /// On TCP: who may log in. None on the Unix socket (its mode is the check).
    gate: Option<Gate>,
}

impl Console {
    /// The console of `engine`, acting through `api` (and listing through it, on a cluster's
    /// node: `cluster`); its host figures sampled from now on.
    pub fn new(engine: Arc<Engine>, api: Router, cluster: bool) -> Arc<Console> {
        let series = Series::spawn(engine.clone());
        let source = live::Source {
            engine: engine.clone(),
            cluster_api: cluster.then(|| api.clone()),
        };
        Arc::new(Console {
            engine,
            source,
            api,
            sessions: Sessions::default(),
            series,
        })
    }

    /// Its access on the Unix socket.
    pub fn on_socket(self: &Arc<Console>) -> Access {
        Access {
            console: self.clone(),
            gate: None,
        }
    }

    /// Its access on the TCP listener, for holders of `gate`'s tokens.
    pub fn on_tcp(self: &Arc<Console>, gate: Gate) -> Access {
        Access {
            console: self.clone(),
            gate: Some(gate),
        }
    }
}

/// Whether `path` is the console's.
fn is_console(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

/// Serves `/ui` and below; everything else goes on to the API.
pub async fn intercept(State(access): State<Access>, req: Request, next: Next) -> Response {
    if !is_console(req.uri().path()) {
        return next.run(req).await;
    }
    access.handle(req).await
}

fn page(status: StatusCode, html: String) -> Response {
    let mut r = (status, html).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(assets::CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    r
}

fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// The request's `Host`, as sent.
fn host_of(req: &Request) -> String {
    req.headers()
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// Why a request a page of another origin could make a browser send is refused: an `Origin`
/// that is not this daemon's as the browser reached it, or `Sec-Fetch-Site` other than
/// same-origin.
fn foreign(req: &Request) -> Option<String> {
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = String::from_utf8_lossy(origin.as_bytes());
        let ours = format!("http://{}", host_of(req));
        if !origin.eq_ignore_ascii_case(&ours) {
            return Some(format!(
                "a request from another origin ({}) is refused: the console acts only for its own pages",
                forkbox_engine::guestlog::quote(&origin)
            ));
        }
    }
    match req.headers().get("sec-fetch-site") {
        Some(site) if !matches!(site.as_bytes(), b"same-origin" | b"none") => Some(
            "a request another site's page started is refused: the console acts only for its own pages"
                .into(),
        ),
        _ => None,
    }
}

impl Access {
    async fn handle(self, req: Request) -> Response {
        if let Some(refused) = self
            .gate
            .as_ref()
            .and_then(|_| crate::auth::misdirected(&req))
        {
            return refused;
        }
        let path = req.uri().path().to_string();
        match (req.method().clone(), path.as_str()) {
            (Method::GET, "/ui/console.css") => assets::css(),
            (Method::GET, "/ui/console.js") => assets::js(),
            (Method::GET, "/ui/login") => page(StatusCode::OK, assets::login_page(None)),
            (Method::POST, "/ui/login") => self.login(req).await,
            _ => self.with_session(req, &path).await,
        }
    }

    /// The session's CSRF token, if the request has a session.
    fn session(&self, req: &Request) -> Option<String> {
        if self.gate.is_none() {
            return Some(self.console.sessions.socket_csrf());
        }
        session::cookie(req).and_then(|c| self.console.sessions.csrf_of(&c))
    }

    async fn with_session(self, req: Request, path: &str) -> Response {
        let csrf = match self.session(&req) {
            Some(c) => c,
            None if req.method() == Method::GET && matches!(path, "/ui" | "/ui/") => {
                return redirect("/ui/login");
            }
            None => return crate::refusal(
                Code::Unauthorized,
                "log in to the console first (/ui/login, with a token from `forkbox token create`)",
            ),
        };
        let changes = !matches!(*req.method(), Method::GET | Method::HEAD);
        if changes {
            if let Some(why) = foreign(&req) {
                return crate::refusal(Code::PermissionDenied, why);
            }
            if self.gate.is_some() && !session::csrf_matches(&req, &csrf) {
                return crate::refusal(
                    Code::PermissionDenied,
                    "an action needs the console's CSRF token in X-Forkbox-CSRF: act from the console's own page",
                );
            }
        }
        match (req.method().clone(), path) {
            (Method::GET, "/ui" | "/ui/") => {
                let state = live::State::now(&self.console.source).await;
                page(
                    StatusCode::OK,
                    assets::index_page(
                        &csrf,
                        &state.initial(&self.console.engine, &self.console.series),
                    ),
                )
            }
            (Method::GET, "/ui/events") => {
                live::events(self.console.source.clone(), self.console.series.clone())
            }
            (Method::POST, "/ui/logout") => {
                if let Some(c) = session::cookie(&req) {
                    self.console.sessions.end(&c);
                }
                let mut r = redirect("/ui/login");
                r.headers_mut()
                    .insert(header::SET_COOKIE, session::cleared_cookie());
                r
            }
            (_, p) if p.starts_with("/ui/api/") => self.api(req).await,
            (Method::GET, p) if p.starts_with("/ui/migrations/") && p.ends_with("/report") => {
                let id = &p["/ui/migrations/".len()..p.len() - "/report".len()];
                report(self.console.engine.migration_report(id), id)
            }
            _ => crate::refusal(
                Code::NotFound,
                format!(
                    "the console has no page {}",
                    forkbox_engine::guestlog::quote(path)
                ),
            ),
        }
    }

    /// Exchanges a token for a session cookie.
    async fn login(self, req: Request) -> Response {
        let Some(gate) = self.gate.clone() else {
            // The socket needs no login.
            return redirect("/ui/");
        };
        if let Some(why) = foreign(&req) {
            return crate::refusal(Code::PermissionDenied, why);
        }
        let body = match axum::body::to_bytes(req.into_body(), MAX_LOGIN_BYTES).await {
            Ok(b) => b,
            Err(_) => {
                return page(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    assets::login_page(Some("that form is too large to be a token")),
                )
            }
        };
        let token = session::form_field(&body, "token").unwrap_or_default();
        let token = token.trim();
        let ok = !token.is_empty()
            && (crate::auth::valid(&gate.paths, token)
                || match &gate.node {
                    Some(n) => n.token_valid(&crate::auth::digest(token)).await,
                    None => false,
                });
        if !ok {
            return page(
                StatusCode::UNAUTHORIZED,
                assets::login_page(Some(
                    "that is not a token of this daemon; make one with `forkbox token create`",
                )),
            );
        }
        match self.console.sessions.begin() {
            Ok((cookie, _)) => {
                let mut r = redirect("/ui/");
                r.headers_mut()
                    .insert(header::SET_COOKIE, session::set_cookie(&cookie));
                r
            }
            Err(e) => crate::refusal(Code::Internal, format!("no session could be made: {e}")),
        }
    }

    /// An API call from the console's page: the API's route, the API's answer.
    async fn api(self, mut req: Request) -> Response {
        let path_and_query = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().trim_start_matches("/ui/api").to_string())
            .unwrap_or_default();
        let Ok(uri) = path_and_query.parse::<Uri>() else {
            return crate::refusal(Code::BadRequest, "not a path of the API");
        };
        *req.uri_mut() = uri;
        // The API never sees the console's cookie or its token, nor the page's origin (checked
        // above): a call the cluster forwards to another node reaches that node's API as a
        // program's, which a page's `Origin` would have it refuse.
        req.headers_mut().remove(header::COOKIE);
        req.headers_mut().remove(CSRF_HEADER);
        req.headers_mut().remove(header::ORIGIN);
        match self.console.api.clone().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }
}

/// A migration's report as its run wrote it: in a sandboxed document of its own (no script,
/// no origin), so nothing in it can act for the console.
fn report(html: Option<Vec<u8>>, id: &str) -> Response {
    let Some(html) = html else {
        return crate::refusal(
            Code::NotFound,
            format!(
                "no report of migration {} is kept here",
                forkbox_engine::guestlog::quote(id)
            ),
        );
    };
    let mut r = Response::new(Body::from(html));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(assets::REPORT_CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// A body that is a static asset.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = Response::new(Body::from(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}
