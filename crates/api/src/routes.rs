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
    /// Its success reply's type as the table spells it ([`reply`] has the type itself).
    pub reply: &'static str,
}

/// Kinds of reply that are not one JSON document.
pub mod body {
    use std::marker::PhantomData;

    /// Bytes as they are (`application/octet-stream`).
    pub struct Octets;
    /// Text in a format of its own (the metrics, the OpenAPI document).
    pub struct Text;
    /// Newline-delimited JSON (`application/x-ndjson`), a `T` a line, as it happens.
    pub struct Lines<T>(PhantomData<T>);
    /// No body: the status says it all.
    pub struct Empty;
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
    ($($op:ident: $method:ident $path:literal -> $reply:ty;)+) => {
        /// Each operation's route by its name, checked when compiled: `op::create.fill(&[])`.
        #[allow(non_upper_case_globals)]
        pub mod op {
            use super::{Method, Route};
            $(pub const $op: Route = Route {
                op: stringify!($op),
                method: Method::$method,
                path: $path,
                reply: stringify!($reply),
            };)+
        }

        /// Each operation's success reply by its name: the server's handler must produce it
        /// and the Rust client returns it (both are checked when compiled).
        #[allow(non_camel_case_types)]
        pub mod reply {
            #[allow(unused_imports)]
            use super::body::*;
            use crate::*;
            $(pub type $op = $reply;)+
        }

        /// Every route of the API.
        pub const ROUTES: &[Route] = &[$(op::$op,)+];
    };
}

routes! {
    metrics: Get "/metrics" -> Text;
    health: Get "/v1/health" -> Health;
    openapi: Get "/v1/openapi.json" -> Text;
    info: Get "/v1/info" -> InfoView;
    list_images: Get "/v1/images" -> Vec<ImageView>;
    build_log: Get "/v1/cluster/builds/{name}" -> BuildLogView;
    list_builds: Get "/v1/builds" -> Vec<BuildView>;
    build_image: Post "/v1/images" -> Lines<BuildProgress>;
    build_dockerfile: Post "/v1/images/dockerfile" -> Lines<BuildProgress>;
    get_image: Get "/v1/images/{reference}" -> ImageView;
    remove_image: Delete "/v1/images/{reference}" -> ImageView;
    create: Post "/v1/sandboxes" -> SandboxView;
    list: Get "/v1/sandboxes" -> Vec<SandboxView>;
    get_one: Get "/v1/sandboxes/{id}" -> SandboxView;
    delete: Delete "/v1/sandboxes/{id}" -> Deleted;
    exec: Post "/v1/sandboxes/{id}/exec" -> ExecResult;
    set_ttl: Post "/v1/sandboxes/{id}/ttl" -> SandboxView;
    set_network: Put "/v1/sandboxes/{id}/network" -> SandboxView;
    set_idle: Put "/v1/sandboxes/{id}/idle" -> SandboxView;
    snapshot: Post "/v1/sandboxes/{id}/snapshot" -> SnapshotMeta;
    fork: Post "/v1/sandboxes/{id}/fork" -> ForkResult;
    hibernate: Post "/v1/sandboxes/{id}/hibernate" -> SandboxView;
    resume: Post "/v1/sandboxes/{id}/resume" -> SandboxView;
    forward_port: Post "/v1/sandboxes/{id}/ports" -> PortView;
    list_ports: Get "/v1/sandboxes/{id}/ports" -> Vec<PortView>;
    close_port: Delete "/v1/sandboxes/{id}/ports/{port}" -> Deleted;
    read_file: Get "/v1/sandboxes/{id}/files" -> Octets;
    write_file: Put "/v1/sandboxes/{id}/files" -> Written;
    list_dir: Get "/v1/sandboxes/{id}/dir" -> DirListing;
    get_archive: Get "/v1/sandboxes/{id}/archive" -> Octets;
    put_archive: Put "/v1/sandboxes/{id}/archive" -> Unpacked;
    start_command: Post "/v1/sandboxes/{id}/commands" -> CommandStarted;
    command_poll: Get "/v1/sandboxes/{id}/commands/{cid}" -> CommandPoll;
    command_events: Get "/v1/sandboxes/{id}/commands/{cid}/events" -> Lines<CommandEvent>;
    command_signal: Post "/v1/sandboxes/{id}/commands/{cid}/signal" -> Empty;
    command_stdin: Post "/v1/sandboxes/{id}/commands/{cid}/stdin" -> StdinWritten;
    command_resize: Post "/v1/sandboxes/{id}/commands/{cid}/resize" -> Empty;
    run_code: Post "/v1/sandboxes/{id}/code" -> Lines<CodeEvent>;
    list_code_contexts: Get "/v1/sandboxes/{id}/code/contexts" -> Vec<CodeContext>;
    create_code_context: Post "/v1/sandboxes/{id}/code/contexts" -> CodeContext;
    restart_code_context: Post "/v1/sandboxes/{id}/code/contexts/{cid}/restart" -> CodeContext;
    delete_code_context: Delete "/v1/sandboxes/{id}/code/contexts/{cid}" -> Deleted;
    list_snapshots: Get "/v1/snapshots" -> Vec<SnapshotMeta>;
    get_snapshot: Get "/v1/snapshots/{id}" -> SnapshotMeta;
    delete_snapshot: Delete "/v1/snapshots/{id}" -> Deleted;
    fork_snapshot: Post "/v1/snapshots/{id}/fork" -> ForkResult;
    create_volume: Post "/v1/volumes" -> VolumeView;
    list_volumes: Get "/v1/volumes" -> Vec<VolumeView>;
    get_volume: Get "/v1/volumes/{name}" -> VolumeView;
    remove_volume: Delete "/v1/volumes/{name}" -> Deleted;
    list_migrations: Get "/v1/migrations" -> Vec<MigrationView>;
    start_migration: Post "/v1/migrations" -> MigrationView;
    migration_event: Post "/v1/migrations/{id}/events" -> MigrationView;
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
