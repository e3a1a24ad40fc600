//! Every operation of the engine as a type of its own, each tied to the one reply it gives
//! ([`Operation::Reply`]): the HTTP server, the CLI's in-process engine and the tests call
//! [`Engine::call`](super::Engine::call) with one of these and get that reply or an
//! [`EngineError`]; an operation cannot answer with another kind of reply.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::{
    ArchiveFormat, BuildProgress, CommandPoll, CommandStarted, CreateRequest, Deleted, DirListing,
    Engine, EngineError, ExecRequest, ExecResult, ForkRequest, ForkResult, GuestPath, IdleRequest,
    ImageView, InfoView, MigrationStart, MigrationView, NetworkPolicy, PortRequest, PortView,
    SandboxState, SandboxView, SnapshotMeta, SnapshotRequest, StdinWritten, TerminalSize, Unpacked,
    Written,
};
use crate::commands::CommandLog;
use crate::error::AgentError;
use crate::image::{ImageRef, Recipe};

/// One operation of the engine: the request (the type's fields) and the reply it gives.
pub trait Operation: Send + Sized + 'static {
    type Reply: Send + 'static;
    /// Whether carrying it out may change what the engine holds (sandboxes, snapshots,
    /// images, ports): [`Engine::call`](super::Engine::call) then moves the engine's change
    /// counter on, which live views wait on. Those that keep them as they were (reads,
    /// commands in a guest, files) are marked `[keeps]` below.
    const CHANGES: bool = true;
    /// Carries the operation out on `engine`.
    fn run(self, engine: &Engine) -> impl Future<Output = Result<Self::Reply, EngineError>> + Send;
}

/// Declares each operation: a struct with public fields, and its [`Operation`] impl running
/// `body` with the engine as `e` and the operation as `op`.
macro_rules! operations {
    (@changes) => { true };
    (@changes keeps) => { false };
    ($(
        $(#[$doc:meta])*
        $name:ident { $($field:ident : $ty:ty),* $(,)? } -> $reply:ty $([$kind:ident])? = |$e:ident, $op:ident| $body:expr;
    )+) => {$(
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name { $(pub $field: $ty),* }

        impl Operation for $name {
            type Reply = $reply;
            const CHANGES: bool = operations!(@changes $($kind)?);
            #[allow(unused_variables)]
            async fn run(self, $e: &Engine) -> Result<$reply, EngineError> {
                let $op = self;
                $body
            }
        }
    )+};
}

operations! {
    /// Makes a sandbox: from the warm pool, the image's template or a snapshot.
    Create { request: CreateRequest } -> SandboxView = |e, op| e.create(op.request).await;
    /// A sandbox's view, hibernated or running.
    Get { id: String } -> SandboxView [keeps] = |e, op| e.view(&op.id).await;
    /// Sandboxes (hibernated ones too) with the label and in the state given, oldest first.
    List { label: Option<(String, String)>, state: Option<SandboxState> } -> Vec<SandboxView> [keeps]
        = |e, op| Ok(e.list(op.label, op.state).await);
    /// Runs a command to its end; its output capped.
    Exec { id: String, request: ExecRequest } -> ExecResult [keeps]
        = |e, op| e.exec(&op.id, op.request).await;
    /// Stops and removes a sandbox (or the snapshot a hibernated one sleeps in).
    Delete { id: String } -> Deleted = |e, op| e.delete(op.id).await;
    /// Sets the TTL anew, counted from now.
    SetTtl { id: String, ttl_seconds: u64 } -> SandboxView
        = |e, op| e.set_ttl(&op.id, op.ttl_seconds).await;
    /// A running sandbox's network policy replaced: the tunnels it opens from now on follow it.
    SetNetwork { id: String, policy: NetworkPolicy } -> SandboxView
        = |e, op| e.set_network(&op.id, op.policy).await;
    /// Saves a running sandbox: memory, processes, disk.
    Snapshot { id: String, request: SnapshotRequest } -> SnapshotMeta
        = |e, op| Ok(e.snapshot(&op.id, op.request).await?.meta);
    /// Saves a sandbox for copies made elsewhere (a cluster's other node): a snapshot removed
    /// with its last copy here, or by its maker once the copies are made.
    SaveForCopies { id: String } -> SnapshotMeta = |e, op| Ok(e.save_for_copies(&op.id).await?.meta);
    /// Copies of a sandbox (saved first) or of a snapshot; `source` names either.
    Fork { source: String, request: ForkRequest } -> ForkResult
        = |e, op| e.fork(&op.source, op.request).await;
    /// A host port whose connections reach a port in the guest (until closed, or the sandbox
    /// goes: a hibernation ends its forwards too).
    ForwardPort { id: String, request: PortRequest } -> PortView
        = |e, op| e.forward_port(&op.id, op.request).await;
    ListPorts { id: String } -> Vec<PortView> [keeps] = |e, op| e.ports(&op.id).await;
    ClosePort { id: String, host_port: u16 } -> Deleted
        = |e, op| e.close_port(&op.id, op.host_port).await;
    /// Saves a sandbox to disk and stops its VM; [`Resume`] brings it back with its processes.
    /// Without `memory`, only its files are kept: the resume boots it from its disk.
    Hibernate { id: String, memory: bool } -> SandboxView
        = |e, op| e.hibernate(&op.id, op.memory).await;
    Resume { id: String } -> SandboxView = |e, op| e.resume(&op.id).await;
    /// A new idle policy: when the sandbox sleeps by itself and whether use wakes it.
    SetIdle { id: String, request: IdleRequest } -> SandboxView
        = |e, op| e.set_idle(&op.id, op.request).await;
    /// Makes a volume: its space taken on the host, its file system made.
    CreateVolume { request: forkbox_api::VolumeCreateRequest } -> forkbox_api::VolumeView
        = |e, op| e.create_volume(op.request).await;
    /// Every volume, with the sandboxes that have it mounted.
    ListVolumes {} -> Vec<forkbox_api::VolumeView> [keeps] = |e, op| e.list_volumes().await;
    GetVolume { name: String } -> forkbox_api::VolumeView [keeps] = |e, op| e.get_volume(&op.name).await;
    /// Removes a volume and what is on it; refused while a sandbox has it mounted.
    RemoveVolume { name: String } -> Deleted = |e, op| e.remove_volume(&op.name).await;
    ListSnapshots {} -> Vec<SnapshotMeta> [keeps] = |e, op| Ok(e.list_snapshots());
    /// The names of the snapshots held here (a cluster node's record: no figures computed).
    SnapshotNames {} -> Vec<String> [keeps] = |e, op| Ok(e.snapshot_names());
    GetSnapshot { name: String } -> SnapshotMeta [keeps] = |e, op| e.get_snapshot(&op.name);
    /// Deletes a snapshot no sandbox depends on.
    DeleteSnapshot { name: String } -> Deleted = |e, op| e.delete_snapshot(op.name).await;
    ListImages {} -> Vec<ImageView> [keeps] = |e, op| Ok(e.list_images());
    /// The builds under way in this home (this daemon's, or a CLI's of the same home).
    ListBuilds {} -> Vec<forkbox_api::BuildView> [keeps] = |e, op| Ok(e.list_builds());
    GetImage { reference: ImageRef } -> ImageView [keeps] = |e, op| e.get_image(&op.reference);
    RemoveImage { reference: ImageRef } -> ImageView = |e, op| e.remove_image(&op.reference).await;
    /// Builds an image; progress goes to `events` when given. `recipe` is parsed and checked
    /// from the front end's request ([`build_recipe`](super::build_recipe)); `source` is its
    /// text as its author wrote it, kept with the image (its TOML when absent: an API dict has
    /// no text of its own); with `if_changed`, builds only if the newest version of the name
    /// came from a different recipe.
    BuildImage {
        recipe: Recipe,
        source: Option<String>,
        if_changed: bool,
        events: Option<mpsc::Sender<BuildProgress>>,
    } -> ImageView = |e, op| e.build_image(op.recipe, op.source, op.if_changed, op.events).await;
    /// Builds the next version of `name` from a Dockerfile (its text) whose build context is
    /// the tar.zst file `context` (the caller's: it removes it after); progress as
    /// [`BuildImage`]'s.
    BuildDockerfile {
        name: String,
        dockerfile: String,
        context: std::path::PathBuf,
        args: std::collections::BTreeMap<String, String>,
        if_changed: bool,
        events: Option<mpsc::Sender<BuildProgress>>,
    } -> ImageView = |e, op| e.build_dockerfile(op).await;
    /// A file's bytes.
    ReadFile { id: String, path: GuestPath } -> Vec<u8> [keeps] = |e, op| e.read_file(&op.id, &op.path).await;
    WriteFile { id: String, path: GuestPath, data: Vec<u8>, mode: u32 } -> Written [keeps]
        = |e, op| e.write_file(&op.id, &op.path, &op.data, op.mode).await;
    ListDir { id: String, path: GuestPath } -> DirListing [keeps] = |e, op| e.list_dir(&op.id, &op.path).await;
    /// What this host and engine are.
    Info {} -> InfoView [keeps] = |e, op| Ok(e.info().await);
    /// Starts a command that outlives the request; its output is kept (see
    /// [`KEEP_COMMANDS`](super::KEEP_COMMANDS)).
    StartCommand { id: String, request: ExecRequest } -> CommandStarted [keeps]
        = |e, op| Ok(CommandStarted { command_id: e.start_command(&op.id, op.request).await? });
    /// A started command's output past chunk `from`, and its exit once it ended.
    PollCommand { id: String, command_id: String, from: usize } -> CommandPoll [keeps]
        = |e, op| e.poll(&op.id, op.command_id, op.from).await;
    /// The log of a started command, to follow from its start.
    AttachCommand { id: String, command_id: String } -> Arc<CommandLog> [keeps]
        = |e, op| e.command(&op.id, &op.command_id).await;
    SignalCommand { id: String, command_id: String, signal: i32 } -> () [keeps]
        = |e, op| {
            e.command(&op.id, &op.command_id).await?.signal(op.signal).await;
            Ok(())
        };
    /// A new size for a started command's terminal.
    ResizeCommand { id: String, command_id: String, size: TerminalSize } -> () [keeps]
        = |e, op| {
            let size = op.size.checked()?;
            e.command(&op.id, &op.command_id).await?.resize(size).await;
            Ok(())
        };
    /// Feeds a started command's standard input with chunks as they arrive; closes it after
    /// them when `close`.
    WriteStdin { id: String, command_id: String, chunks: mpsc::Receiver<Vec<u8>>, close: bool }
        -> StdinWritten [keeps] = |e, op| e.write_stdin(&op.id, &op.command_id, op.chunks, op.close).await;
    /// Runs one code cell in the sandbox's code server (started first if it is not running):
    /// its events as they come, `end` last.
    RunCode { id: String, request: forkbox_api::RunCodeRequest }
        -> mpsc::Receiver<forkbox_api::CodeEvent> [keeps] = |e, op| e.run_code(&op.id, op.request).await;
    /// The code server's contexts (it is started first if it is not running).
    CodeContexts { id: String } -> Vec<forkbox_api::CodeContext> [keeps]
        = |e, op| e.code_contexts(&op.id).await;
    /// A new code context: a language, a working directory, state of its own.
    CreateCodeContext { id: String, request: forkbox_api::CodeContextRequest }
        -> forkbox_api::CodeContext [keeps] = |e, op| e.create_code_context(&op.id, op.request).await;
    /// A code context started again, its state gone.
    RestartCodeContext { id: String, context_id: String } -> forkbox_api::CodeContext [keeps]
        = |e, op| e.restart_code_context(&op.id, &op.context_id).await;
    /// A code context ended.
    DeleteCodeContext { id: String, context_id: String } -> Deleted [keeps]
        = |e, op| e.delete_code_context(&op.id, &op.context_id).await;
    /// Unpacks an archive (chunks as they arrive) into `path` in the sandbox.
    PutArchive { id: String, path: String, format: ArchiveFormat, chunks: mpsc::Receiver<Vec<u8>> }
        -> Unpacked [keeps] = |e, op| e.put_archive(&op.id, &op.path, op.format, op.chunks).await;
    /// `path` in the sandbox as an archive: its chunks as they come; an error ends it early.
    GetArchive { id: String, path: String, format: ArchiveFormat }
        -> mpsc::Receiver<Result<Vec<u8>, AgentError>> [keeps]
        = |e, op| e.get_archive(&op.id, &op.path, op.format).await;
    /// A snapshot held here as chunks (see [`crate::snapshot::chunks`]), encoded.
    SnapshotManifest { name: String } -> Vec<u8> [keeps] = |e, op| e.manifest_of(&op.name).await;
    /// Chunks of a snapshot held here, their bytes one after another.
    SnapshotChunks { name: String, hashes: Vec<crate::snapshot::chunks::Hash> } -> Vec<u8> [keeps]
        = |e, op| e.chunks_of(&op.name, op.hashes).await;
    /// How this node would assemble a snapshot it lacks; refused when it would not fit.
    PlanPull { manifest: crate::snapshot::chunks::Manifest } -> crate::snapshot::chunks::Plan [keeps]
        = |e, op| e.plan_pull(op.manifest).await;
    /// Starts assembling a snapshot (its RAM file, the base copied) while its chunks come.
    StagePull { base: Option<std::path::PathBuf>, mem_len: u64 } -> std::path::PathBuf
        = |e, op| e.stage(op.base, op.mem_len).await;
    /// Drops a staged assembly whose chunks did not all come.
    DiscardStaged { staged: std::path::PathBuf } -> () [keeps]
        = |e, op| {
            crate::snapshot::chunks::discard(&op.staged);
            Ok(())
        };
    /// Finishes a staged snapshot from this node's files and `fetched` (verified) chunks.
    AssemblePull {
        plan: crate::snapshot::chunks::Plan,
        fetched: std::collections::HashMap<crate::snapshot::chunks::Hash, Vec<u8>>,
        staged: std::path::PathBuf,
    } -> SnapshotMeta = |e, op| e.assemble(op.plan, op.fetched, op.staged).await;
    /// An image held here as chunks, encoded.
    ImageManifest { reference: ImageRef } -> Vec<u8> [keeps] = |e, op| e.image_manifest_of(&op.reference).await;
    /// How this node would assemble an image it lacks; refused when it would not fit.
    PlanImagePull { manifest: crate::snapshot::chunks::ImageManifest }
        -> crate::snapshot::chunks::ImagePlan [keeps] = |e, op| e.plan_image_pull(op.manifest).await;
    /// Assembles a planned image from this node's files and `fetched` (verified) chunks.
    AssembleImagePull {
        plan: crate::snapshot::chunks::ImagePlan,
        fetched: std::collections::HashMap<crate::snapshot::chunks::Hash, Vec<u8>>,
    } -> ImageView = |e, op| e.assemble_image(op.plan, op.fetched).await;
    /// Runs of `forkbox migrate` this daemon knows, newest first.
    ListMigrations {} -> Vec<MigrationView> [keeps] = |e, op| e.migrations();
    /// A run of `forkbox migrate` registers.
    StartMigration { start: MigrationStart } -> MigrationView = |e, op| e.start_migration(op.start);
    /// A registered run's progress, or its end.
    MigrationProgress { id: String, event: super::MigrationEvent } -> MigrationView
        = |e, op| e.migration_event(&op.id, op.event);
    /// The metrics in the OpenMetrics text format.
    Metrics {} -> String [keeps] = |e, op| Ok(e.metrics().encode());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_keep_and_changes_change() {
        // What a live view waits on: every change moves the counter, no read does.
        const KEEPS: [bool; 6] = [
            Get::CHANGES,
            List::CHANGES,
            ListSnapshots::CHANGES,
            Exec::CHANGES,
            ListMigrations::CHANGES,
            Metrics::CHANGES,
        ];
        const CHANGE: [bool; 8] = [
            Create::CHANGES,
            Delete::CHANGES,
            Fork::CHANGES,
            Snapshot::CHANGES,
            Hibernate::CHANGES,
            Resume::CHANGES,
            DeleteSnapshot::CHANGES,
            MigrationProgress::CHANGES,
        ];
        assert_eq!(KEEPS, [false; 6]);
        assert_eq!(CHANGE, [true; 8]);
    }
}
