//! The HTTP routes as data: one table the server's router, its OpenAPI annotations, the Rust
//! client and both SDKs are checked against (a route spelled differently anywhere fails a test).

/// One operation's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The operation's name (the OpenAPI `operationId`: the server's handler).
    pub op: &'static str,
    pub method: Method,
    /// With `{name}` for each path parameter, as the router and OpenAPI spell them.
    pub path: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
}

impl Method {
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
        }
    }
}

macro_rules! routes {
    ($($op:ident: $method:ident $path:literal;)+) => {
        /// Each operation's route by its name, checked when compiled: `op::create.fill(&[])`.
        #[allow(non_upper_case_globals)]
        pub mod op {
            use super::{Method, Route};
            $(pub const $op: Route = Route { op: stringify!($op), method: Method::$method, path: $path };)+
        }

        /// Every route of the API.
        pub const ROUTES: &[Route] = &[$(op::$op,)+];
    };
}

routes! {
    metrics: Get "/metrics";
    health: Get "/v1/health";
    openapi: Get "/v1/openapi.json";
    info: Get "/v1/info";
    list_images: Get "/v1/images";
    build_image: Post "/v1/images";
    get_image: Get "/v1/images/{reference}";
    remove_image: Delete "/v1/images/{reference}";
    create: Post "/v1/sandboxes";
    list: Get "/v1/sandboxes";
    get_one: Get "/v1/sandboxes/{id}";
    delete: Delete "/v1/sandboxes/{id}";
    exec: Post "/v1/sandboxes/{id}/exec";
    set_ttl: Post "/v1/sandboxes/{id}/ttl";
    snapshot: Post "/v1/sandboxes/{id}/snapshot";
    fork: Post "/v1/sandboxes/{id}/fork";
    hibernate: Post "/v1/sandboxes/{id}/hibernate";
    resume: Post "/v1/sandboxes/{id}/resume";
    read_file: Get "/v1/sandboxes/{id}/files";
    write_file: Put "/v1/sandboxes/{id}/files";
    list_dir: Get "/v1/sandboxes/{id}/dir";
    get_archive: Get "/v1/sandboxes/{id}/archive";
    put_archive: Put "/v1/sandboxes/{id}/archive";
    start_command: Post "/v1/sandboxes/{id}/commands";
    command_poll: Get "/v1/sandboxes/{id}/commands/{cid}";
    command_events: Get "/v1/sandboxes/{id}/commands/{cid}/events";
    command_signal: Post "/v1/sandboxes/{id}/commands/{cid}/signal";
    command_stdin: Post "/v1/sandboxes/{id}/commands/{cid}/stdin";
    command_resize: Post "/v1/sandboxes/{id}/commands/{cid}/resize";
    list_snapshots: Get "/v1/snapshots";
    get_snapshot: Get "/v1/snapshots/{id}";
    delete_snapshot: Delete "/v1/snapshots/{id}";
    fork_snapshot: Post "/v1/snapshots/{id}/fork";
}

/// The route of operation `op`.
pub fn route(op: &str) -> Option<&'static Route> {
    ROUTES.iter().find(|r| r.op == op)
}

impl Route {
    /// The path with its parameters filled in order (each percent-encoded as one segment).
    pub fn fill(&self, args: &[&str]) -> String {
        let mut out = String::with_capacity(self.path.len() + 32);
        let mut args = args.iter();
        let mut rest = self.path;
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let close = rest[open..].find('}').map_or(rest.len(), |c| open + c + 1);
            out.push_str(&segment(args.next().copied().unwrap_or("")));
            rest = &rest[close..];
        }
        out.push_str(rest);
        out
    }
}

/// `s` as one path segment: everything but unreserved characters percent-encoded.
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~@".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operation_once_and_each_route_once() {
        let mut ops = std::collections::HashSet::new();
        let mut routes = std::collections::HashSet::new();
        for r in ROUTES {
            assert!(ops.insert(r.op), "{} twice", r.op);
            assert!(
                routes.insert((r.method, r.path)),
                "{:?} {} twice",
                r.method,
                r.path
            );
        }
    }

    #[test]
    fn parameters_are_filled_as_one_segment_each() {
        let r = route("command_poll").map(|r| r.fill(&["sb-1", "a/b c"]));
        assert_eq!(r.as_deref(), Some("/v1/sandboxes/sb-1/commands/a%2Fb%20c"));
        assert_eq!(
            route("get_image").map(|r| r.fill(&["py@3"])).as_deref(),
            Some("/v1/images/py@3")
        );
    }
}
