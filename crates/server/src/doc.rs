//! The API's OpenAPI document, generated from the handlers' annotations and the engine's
//! request and reply types (`utoipa`), served at `/v1/openapi.json`. Tests check it against
//! the router and real answers against its schemas.

use utoipa::OpenApi;

use super::*;
use forkbox_engine::api::CodeEvent;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "forkbox",
        description = "Disposable microVM sandboxes with snapshot and fork. On the daemon's Unix \
            socket (mode 0600) without credentials; on its TCP listener with `Authorization: \
            Bearer TOKEN` (`forkbox token create`). Errors are `{\"error\": message}` with the \
            status the engine gives them. Streams are newline-delimited JSON, one event a line."
    ),
    paths(
        health,
        openapi,
        metrics,
        info,
        list_images,
        build_log,
        list_builds,
        build_image,
        build_dockerfile,
        get_image,
        remove_image,
        create,
        list,
        get_one,
        delete,
        exec,
        set_ttl,
        set_network,
        set_idle,
        snapshot,
        fork,
        hibernate,
        resume,
        forward_port,
        list_ports,
        close_port,
        start_command,
        command_poll,
        command_events,
        command_signal,
        command_stdin,
        command_resize,
        run_code,
        list_code_contexts,
        create_code_context,
        restart_code_context,
        delete_code_context,
        put_archive,
        get_archive,
        read_file,
        write_file,
        list_dir,
        list_snapshots,
        get_snapshot,
        delete_snapshot,
        fork_snapshot,
        create_volume,
        list_volumes,
        get_volume,
        remove_volume,
        list_migrations,
        start_migration,
        migration_event,
    ),
    components(schemas(ErrorBody, BuildProgress, CommandEvent, CodeEvent, ArchiveFormat))
)]
struct Api;

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    Api::openapi()
}

/// The document as JSON.
pub fn json() -> String {
    document().to_pretty_json().unwrap_or_default()
}
