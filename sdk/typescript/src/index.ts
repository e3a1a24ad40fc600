// forkbox: disposable microVM sandboxes with snapshot and fork, for agents.
//
//   const runtime = new Runtime();
//   await using sbx = await runtime.sandboxes.create({ image: "python-bookworm" });
//   const { exitCode, stdout } = await sbx.exec("python3 -V");

import { StringDecoder } from "node:string_decoder";

import {
  BuildError,
  ExecTimeoutError,
  ForkboxError,
  NotFoundError,
} from "./errors.js";
import { CodeContext, Execution, RunCodeOptions, contextId, runCode } from "./code.js";
import { ConnectOptions, Transport } from "./http.js";
import { packDir } from "./tar.js";

export * from "./errors.js";
export type { CodeContext, CodeError, CodeResult, Execution, RunCodeOptions } from "./code.js";
export type { ConnectOptions } from "./http.js";

// Node 18.18+ and 20.4+ define it; older runtimes get one so `await using` still works.
(Symbol as { asyncDispose?: symbol }).asyncDispose ??= Symbol.for("Symbol.asyncDispose");

/** A shell string (run with `/bin/sh -c`) or an argv array (run directly). */
export type Cmd = string | string[];

/**
 * `{ internet: true }` or `{ allow: ["pypi.org", "*.pythonhosted.org"] }`; none by default.
 * With `internet`, `deny` keeps names, addresses or networks (`10.0.0.0/8`) out of reach, and
 * `allow` entries are the exceptions.
 */
export interface NetworkPolicy {
  internet?: boolean;
  allow?: string[];
  deny?: string[];
}

/** A recipe: `base` is a Debian suite (bullseye, bookworm, trixie), a forkbox image
 * (NAME or NAME@N) or a registry's image (`python:3.8-slim`, `HOST:PORT/PATH:TAG`,
 * `…@sha256:…`, pinned to its digest by the build); Debian bookworm without it. On a
 * registry's image the steps run in a sandbox of it, with the network on for the build. */
export interface Recipe {
  base?: string;
  apt?: string[];
  pip?: string[];
  npm?: string[];
  run?: string[];
  env?: Record<string, string>;
  disk_free_mib?: number;
  mirror?: string;
}

export interface Image {
  reference: string;
  name: string;
  version: number;
  suite: string;
  base?: string;
  /** The registry image under it, pinned: `HOST/PATH@sha256:…`. */
  pulled?: string;
  /** Where commands start unless they say (a registry image's WorkingDir). */
  workdir?: string;
  /** Who commands run as unless they say (a registry image's User). */
  user?: string;
  guest_kernel: string;
  content_mib: number;
  disk_mib: number;
  created_unix: number;
  build_seconds: number;
  env: Record<string, string>;
}

/** A build's progress: a step starting, or a line of its output. */
export type BuildProgress =
  | { type: "step"; n: number; total: number; what: string }
  | { type: "log"; line: string };

/** How a command ended and what it printed: 64 KiB per stream for a plain exec (the
 * `*Truncated` flags say when more was cut), everything when streamed. */
export interface ExecResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  signal: number | null;
  timedOut: boolean;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  durationMs: number;
}

export interface ExecOptions {
  cwd?: string;
  env?: Record<string, string>;
  /** Kill the command after this long (at most 24 h); the call then throws ExecTimeoutError. */
  timeoutMs?: number;
  /** Streams output as it is printed (the result then keeps all of it). */
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
}

export interface CreateOptions {
  /** NAME or NAME@N; the default image when absent. */
  image?: string;
  /** Start from this snapshot instead. */
  snapshot?: string;
  ttlSeconds?: number;
  /** Kept (hibernated) when the TTL passes, and not deleted by `await using`. */
  persistent?: boolean;
  network?: NetworkPolicy;
  labels?: Record<string, string>;
  cpus?: number;
  memoryMib?: number;
  diskGib?: number;
  /** In a cluster: the node to put it on (default: placed by room and what nodes hold). */
  node?: string;
  /** Secrets the sandbox's requests carry: the guest sees a placeholder in `$NAME`, and
   * HTTPS requests to `hosts` carry `value` in its place; the value never enters the guest
   * and is never returned. */
  secrets?: Secret[];
  /** Sleep after this many seconds unused (no command running, no stream or port connection
   * open, no call): hibernated with its memory and processes, and woken by the next call that
   * needs it (`wakeOnUse: false`: only by `resume()`). */
  idleSeconds?: number;
  wakeOnUse?: boolean;
  /** Volumes to mount: `"NAME:/path"` (read-write: one sandbox at a time), `"NAME:/path:ro"`
   * (read-only: any number), or `{ name, path, readOnly }`. */
  volumes?: VolumeMountSpec[];
}

/** A volume to mount (see `CreateOptions.volumes`). */
export type VolumeMountSpec = string | { name: string; path: string; readOnly?: boolean };

/** A volume and the sandboxes that have it mounted. */
export interface Volume {
  name: string;
  size_bytes: number;
  created_unix: number;
  holders: Array<{ sandbox: string; read_only: boolean }>;
  node?: string;
}

/** A secret for a sandbox (see `CreateOptions.secrets`). */
export interface Secret {
  /** The environment variable its placeholder is in. */
  name: string;
  /** Where the value may go: `api.example.com`, `*.example.com`, `host:port`, an IP. */
  hosts: string[];
  /** Write-only. */
  value: string;
}

/** A snapshot brought to a node by chunks (the daemon's `Transfer`). */
export interface Transfer {
  snapshot?: string;
  image?: string;
  node: string;
  from: string[];
  bytes_moved: number;
  needed_bytes: number;
  manifest_bytes: number;
  chunks_fetched: number;
  chunks_local: number;
  layers_held: number;
  layers: number;
  chunks_refetched: number;
  duration_ms: number;
}

export interface ForkOptions {
  /** 1 to 20 copies. */
  count?: number;
  ttlSeconds?: number;
  network?: NetworkPolicy;
  labels?: Record<string, string>;
  /** In a cluster: the node the copies run on (one without the snapshot brings it first). */
  node?: string;
  /** The copies' secrets, each copy with placeholders of its own (a copy never carries the
   * source's). */
  secrets?: Secret[];
  /** The copies' idle policy (see `CreateOptions.idleSeconds`); a copy does not inherit its
   * source's. */
  idleSeconds?: number;
  wakeOnUse?: boolean;
  /** More volumes for the copies (copies of a sandbox have its read-only volumes anyway,
   * never its read-write ones). */
  volumes?: VolumeMountSpec[];
}

export interface DirEntry {
  name: string;
  kind: "file" | "dir" | "symlink" | "other";
  size: number;
  mode: number;
  modified_unix: number;
}

/** What the daemon says of a sandbox. */
export interface SandboxInfo {
  id: string;
  image: string;
  state: "running" | "disk_full" | "sleeping" | "hibernated" | "failed" | "lost";
  /** When it sleeps by itself, if it does. */
  idle?: { after_secs: number; action: "hibernate" } | null;
  /** Whether use wakes it while it sleeps. */
  wake_on_use?: boolean;
  /** The node that runs it, in a cluster. */
  node?: string;
  /** In a cluster, when the snapshot it started from was brought to its node: what moved. */
  transfer?: Transfer;
  /** Its secrets' names and hosts (never their values). */
  secrets?: Array<{ name: string; hosts: string[] }>;
  failure?: string;
  labels: Record<string, string>;
  ttl_action: "delete" | "hibernate";
  [key: string]: unknown;
}

interface WireExit {
  exit_code: number;
  signal: number | null;
  timed_out: boolean;
  duration_ms: number;
  stdout?: string;
  stderr?: string;
  stdout_truncated?: boolean;
  stderr_truncated?: boolean;
}

type WireEvent =
  | { type: "command"; command_id: string }
  | { type: "stdout" | "stderr"; data_b64: string }
  | ({ type: "exit" } & WireExit)
  | { type: "error"; message: string; exit_code?: number };

function execBody(cmd: Cmd, o: ExecOptions): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  if (typeof cmd === "string") body.shell = cmd;
  else if (Array.isArray(cmd) && cmd.length > 0) body.argv = cmd;
  else throw new TypeError("cmd must be a shell string or a non-empty array of strings");
  if (o.cwd !== undefined) body.cwd = o.cwd;
  if (o.env) body.env = o.env;
  if (o.timeoutMs !== undefined) body.timeout_ms = Math.round(o.timeoutMs);
  return body;
}

function toResult(w: WireExit, stdout?: string, stderr?: string): ExecResult {
  return {
    exitCode: w.exit_code,
    stdout: stdout ?? w.stdout ?? "",
    stderr: stderr ?? w.stderr ?? "",
    signal: w.signal ?? null,
    timedOut: !!w.timed_out,
    stdoutTruncated: !!w.stdout_truncated,
    stderrTruncated: !!w.stderr_truncated,
    durationMs: w.duration_ms,
  };
}

function checked(r: ExecResult, timeoutMs?: number): ExecResult {
  if (r.timedOut) {
    throw new ExecTimeoutError(`the command ran past its timeout of ${timeoutMs} ms and was killed`, r);
  }
  return r;
}

function network(n?: NetworkPolicy): NetworkPolicy | undefined {
  if (!n || (!n.internet && !(n.allow ?? []).length)) return undefined;
  const p: NetworkPolicy = { internet: !!n.internet, allow: n.allow ?? [] };
  if (n.deny?.length) p.deny = n.deny;
  return p;
}

/** Reads a command's event stream into callbacks and a result. */
async function collect(events: AsyncGenerator<WireEvent>, o: ExecOptions): Promise<ExecResult> {
  const dec = { stdout: new StringDecoder("utf8"), stderr: new StringDecoder("utf8") };
  const text = { stdout: [] as string[], stderr: [] as string[] };
  const on = { stdout: o.onStdout, stderr: o.onStderr };
  for await (const ev of events) {
    if (ev.type === "stdout" || ev.type === "stderr") {
      const t = dec[ev.type].write(Buffer.from(ev.data_b64, "base64"));
      text[ev.type].push(t);
      if (t) on[ev.type]?.(t);
    } else if (ev.type === "exit") {
      text.stdout.push(dec.stdout.end());
      text.stderr.push(dec.stderr.end());
      return checked(toResult(ev, text.stdout.join(""), text.stderr.join("")), o.timeoutMs);
    } else if (ev.type === "error") {
      // It could not start, as a shell says it: 127 not found, 126 not runnable.
      if (ev.exit_code !== undefined) {
        return toResult(
          { exit_code: ev.exit_code, signal: null, timed_out: false, duration_ms: 0 },
          text.stdout.join(""),
          text.stderr.join("") + `forkbox: ${ev.message}\n`,
        );
      }
      throw new ForkboxError(ev.message);
    }
  }
  throw new ForkboxError("the command's event stream ended before the command did");
}

/** A connection to a forkbox daemon. */
export class Runtime {
  /** @internal */ readonly t: Transport;
  readonly images: Images;
  readonly sandboxes: Sandboxes;
  readonly snapshots: Snapshots;
  readonly volumes: Volumes;

  constructor(opts: ConnectOptions = {}) {
    this.t = new Transport(opts);
    this.images = new Images(this);
    this.sandboxes = new Sandboxes(this);
    this.snapshots = new Snapshots(this);
    this.volumes = new Volumes(this);
  }

  /** The daemon: version, home, the accelerator sandboxes get (kvm or tcg) and why. */
  info(): Promise<Record<string, unknown>> {
    return this.t.json("GET", "/info");
  }

  /** Closes idle connections so the process can exit at once. */
  close(): void {
    this.t.close();
  }
}

export class Images {
  constructor(private readonly rt: Runtime) {}

  /** Builds the next version of `name` from `recipe`; `ifChanged` reuses the newest version
   * when it came from the same recipe. */
  async build(o: {
    name: string;
    recipe?: Recipe;
    ifChanged?: boolean;
    onProgress?: (ev: BuildProgress) => void;
  }): Promise<Image> {
    const body = { name: o.name, recipe: o.recipe ?? {}, if_changed: !!o.ifChanged };
    type Ev = BuildProgress | { type: "done" | "up_to_date"; image: Image } | { type: "error"; message: string; status: number; code?: string };
    for await (const ev of this.rt.t.events<Ev>("POST", "/images", { json: body })) {
      if (ev.type === "step" || ev.type === "log") o.onProgress?.(ev);
      else if (ev.type === "error") throw new BuildError(ev.message, ev.status, ev.code);
      else return ev.image;
    }
    throw new BuildError(`the build of ${o.name} ended without a result`);
  }

  list(): Promise<Image[]> {
    return this.rt.t.json("GET", "/images");
  }

  get(reference: string): Promise<Image> {
    return this.rt.t.json("GET", `/images/${encodeURIComponent(reference)}`);
  }

  remove(reference: string): Promise<Image> {
    return this.rt.t.json("DELETE", `/images/${encodeURIComponent(reference)}`);
  }
}

export class Sandboxes {
  constructor(private readonly rt: Runtime) {}

  /** A new running sandbox. No network unless `network` says so. */
  async create(o: CreateOptions = {}): Promise<Sandbox> {
    const body: Record<string, unknown> = { labels: o.labels ?? {} };
    if (o.image !== undefined) body.image = o.image;
    if (o.snapshot !== undefined) body.snapshot = o.snapshot;
    if (o.ttlSeconds !== undefined) body.ttl_seconds = o.ttlSeconds;
    if (o.cpus !== undefined) body.cpus = o.cpus;
    if (o.memoryMib !== undefined) body.memory_mib = o.memoryMib;
    if (o.diskGib !== undefined) body.disk_gib = o.diskGib;
    if (o.node !== undefined) body.node = o.node;
    if (o.secrets?.length) body.secrets = secretsBody(o.secrets);
    const net = network(o.network);
    if (net) body.network = net;
    if (o.persistent) body.ttl_action = "hibernate";
    Object.assign(body, idleBody(o.idleSeconds, o.wakeOnUse));
    if (o.volumes?.length) body.volumes = volumesBody(o.volumes);
    return new Sandbox(this.rt, await this.rt.t.json<SandboxInfo>("POST", "/sandboxes", { json: body }));
  }

  async get(id: string): Promise<Sandbox> {
    return new Sandbox(this.rt, await this.rt.t.json<SandboxInfo>("GET", `/sandboxes/${id}`));
  }

  /** Every sandbox (in a cluster: of every node), or those with `label` ("k=v"), in `state`,
   * on `node`. */
  async list(filter: { label?: string; state?: string; node?: string } = {}): Promise<Sandbox[]> {
    const query: Record<string, string> = {};
    if (filter.label) query.label = filter.label;
    if (filter.state) query.state = filter.state;
    if (filter.node) query.node = filter.node;
    const all = await this.rt.t.json<SandboxInfo[]>("GET", "/sandboxes", { query });
    return all.map((v) => new Sandbox(this.rt, v));
  }
}

export class Snapshots {
  constructor(private readonly rt: Runtime) {}

  async list(): Promise<Snapshot[]> {
    const all = await this.rt.t.json<Array<{ name: string }>>("GET", "/snapshots");
    return all.map((m) => new Snapshot(this.rt, m));
  }

  async get(name: string): Promise<Snapshot> {
    return new Snapshot(this.rt, await this.rt.t.json("GET", `/snapshots/${name}`));
  }
}

function forkBody(o: ForkOptions): Record<string, unknown> {
  // The daemon checks the count (1 to 20), with the same words and code as for every client.
  const count = o.count ?? 1;
  const body: Record<string, unknown> = { count, labels: o.labels ?? {} };
  if (o.ttlSeconds !== undefined) body.ttl_seconds = o.ttlSeconds;
  if (o.network) body.network = network(o.network) ?? { internet: false, allow: [] };
  if (o.node !== undefined) body.node = o.node;
  if (o.secrets?.length) body.secrets = secretsBody(o.secrets);
  Object.assign(body, idleBody(o.idleSeconds, o.wakeOnUse));
  if (o.volumes?.length) body.volumes = volumesBody(o.volumes);
  return body;
}

/** Volume mounts as the API takes them. */
function volumesBody(v: VolumeMountSpec[]): Array<{ name: string; path: string; read_only: boolean }> {
  return v.map((m) => {
    if (typeof m !== "string") return { name: m.name, path: m.path, read_only: m.readOnly ?? false };
    const at = m.indexOf(":");
    let path = m.slice(at + 1);
    let ro = false;
    if (path.endsWith(":ro") || path.endsWith(":rw")) {
      ro = path.endsWith(":ro");
      path = path.slice(0, -3);
    }
    if (at <= 0 || !path) throw new TypeError(`${JSON.stringify(m)} is not a volume mount: give NAME:/path or NAME:/path:ro`);
    return { name: m.slice(0, at), path, read_only: ro };
  });
}

/** Volumes: disks of their own that outlive the sandboxes that mount them. */
export class Volumes {
  constructor(private readonly rt: Runtime) {}

  /** Makes volume `name` of `size` ("512m", "10g"; 1 GiB by default), its space taken on the
   * host at once. */
  create(name: string, o: { size?: string; node?: string } = {}): Promise<Volume> {
    const body: Record<string, unknown> = { name };
    if (o.size !== undefined) body.size = o.size;
    if (o.node !== undefined) body.node = o.node;
    return this.rt.t.json("POST", "/volumes", { json: body });
  }

  list(): Promise<Volume[]> {
    return this.rt.t.json("GET", "/volumes");
  }

  get(name: string): Promise<Volume> {
    return this.rt.t.json("GET", `/volumes/${name}`);
  }

  /** Removes the volume and what is on it; refused (`ConflictError`) while a sandbox has it
   * mounted. */
  async remove(name: string): Promise<void> {
    await this.rt.t.json("DELETE", `/volumes/${name}`);
  }
}

/** The idle policy of a create, a fork or `setIdle`. */
function idleBody(idleSeconds?: number | null, wakeOnUse?: boolean): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  if (idleSeconds !== undefined && idleSeconds !== null) {
    body.idle = { after_secs: idleSeconds, action: "hibernate" };
  }
  if (wakeOnUse !== undefined) body.wake_on_use = wakeOnUse;
  return body;
}

function secretsBody(secrets: Secret[]): Secret[] {
  return secrets.map((s) => ({ name: s.name, hosts: [...s.hosts], value: s.value }));
}

async function forked(rt: Runtime, route: string, o: ForkOptions): Promise<Sandbox[]> {
  const reply = await rt.t.json<{ sandboxes: SandboxInfo[]; failed: string[] }>("POST", route, {
    json: forkBody(o),
  });
  const made = reply.sandboxes.map((v) => new Sandbox(rt, v));
  if (reply.failed.length) {
    await Promise.all(made.map((s) => s.stop()));
    throw new ForkboxError(`fork failed: ${reply.failed.join("; ")}`);
  }
  return made;
}

/** A saved sandbox (files, memory, processes); fork it into new sandboxes. */
export class Snapshot {
  readonly name: string;
  constructor(
    private readonly rt: Runtime,
    readonly meta: { name: string; [k: string]: unknown },
  ) {
    this.name = meta.name;
  }

  /** Running sandboxes made from this snapshot. */
  fork(o: ForkOptions = {}): Promise<Sandbox[]> {
    return forked(this.rt, `/snapshots/${this.name}/fork`, o);
  }

  async delete(): Promise<void> {
    await this.rt.t.json("DELETE", `/snapshots/${this.name}`);
  }
}

/** A running sandbox. `await using` deletes it when the scope ends, unless persistent. */
export class Sandbox {
  readonly id: string;
  info: SandboxInfo;
  readonly files: Files;
  /** Ports of the guest reached from this host: `await sbx.ports.forward(3000)` is a URL. */
  readonly ports: Ports;

  constructor(
    private readonly rt: Runtime,
    info: SandboxInfo,
  ) {
    this.id = info.id;
    this.info = info;
    this.files = new Files(rt, info.id);
    this.ports = new Ports(rt, info.id);
  }

  get persistent(): boolean {
    return this.info.ttl_action === "hibernate";
  }

  async refresh(): Promise<SandboxInfo> {
    this.info = await this.rt.t.json<SandboxInfo>("GET", `/sandboxes/${this.id}`);
    return this.info;
  }

  /** Runs `cmd` and waits for it. */
  async exec(cmd: Cmd, o: ExecOptions = {}): Promise<ExecResult> {
    const body = execBody(cmd, o);
    const route = `/sandboxes/${this.id}/exec`;
    if (!o.onStdout && !o.onStderr) {
      return checked(toResult(await this.rt.t.json<WireExit>("POST", route, { json: body })), o.timeoutMs);
    }
    return collect(this.rt.t.events<WireEvent>("POST", route, { json: body, query: { stream: "true" } }), o);
  }

  /** Starts `cmd` in the background; `wait()` for it later. */
  async start(cmd: Cmd, o: Omit<ExecOptions, "onStdout" | "onStderr"> = {}): Promise<DetachedCommand> {
    const reply = await this.rt.t.json<{ command_id: string }>("POST", `/sandboxes/${this.id}/commands`, {
      json: execBody(cmd, o),
    });
    return new DetachedCommand(this.rt, this.id, reply.command_id, o.timeoutMs);
  }

  /** Runs a code cell, keeping state between cells as a notebook does: `python` (the default;
   * a Jupyter kernel), `javascript` or `bash`, each with a default context, or a `context` of
   * `createCodeContext`. An exception in the cell is the execution's `error`, not thrown. The
   * first cell starts the sandbox's code server (its image needs ipykernel: `code-interpreter`
   * has it, with numpy, pandas and matplotlib). At most 300 s a cell. */
  runCode(code: string, o: RunCodeOptions = {}): Promise<Execution> {
    return runCode(this.rt.t, this.id, code, o);
  }

  /** A new context for `runCode`: its own state, language and working directory. */
  createCodeContext(o: { language?: "python" | "javascript" | "bash"; cwd?: string } = {}): Promise<CodeContext> {
    return this.rt.t.json("POST", `/sandboxes/${this.id}/code/contexts`, { json: o });
  }

  listCodeContexts(): Promise<CodeContext[]> {
    return this.rt.t.json("GET", `/sandboxes/${this.id}/code/contexts`);
  }

  /** Starts a context again, its state gone. */
  restartCodeContext(c: CodeContext | string): Promise<CodeContext> {
    return this.rt.t.json("POST", `/sandboxes/${this.id}/code/contexts/${contextId(c)}/restart`);
  }

  async removeCodeContext(c: CodeContext | string): Promise<void> {
    await this.rt.t.json("DELETE", `/sandboxes/${this.id}/code/contexts/${contextId(c)}`);
  }

  /** Saves the sandbox (files, memory, processes); it keeps running. */
  async snapshot(o: { name?: string; stayPaused?: boolean } = {}): Promise<Snapshot> {
    const body: Record<string, unknown> = { stay_paused: !!o.stayPaused };
    if (o.name) body.name = o.name;
    return new Snapshot(this.rt, await this.rt.t.json("POST", `/sandboxes/${this.id}/snapshot`, { json: body }));
  }

  /** `count` (1-20) running copies of this sandbox as it is now; it keeps running. */
  fork(o: ForkOptions = {}): Promise<Sandbox[]> {
    return forked(this.rt, `/sandboxes/${this.id}/fork`, o);
  }

  /** Saves the sandbox to disk and stops its VM; `resume()` brings it back. */
  /**
   * Saves the sandbox to disk and stops its VM; `resume()` brings it back. With
   * `{ memory: false }` only its files are kept: the resume boots it from its disk, with its id
   * and machine id but none of its processes.
   */
  async hibernate(opts: { memory?: boolean } = {}): Promise<void> {
    const q = opts.memory === false ? "?memory=false" : "";
    this.info = await this.rt.t.json("POST", `/sandboxes/${this.id}/hibernate${q}`);
  }

  async resume(): Promise<void> {
    this.info = await this.rt.t.json("POST", `/sandboxes/${this.id}/resume`);
  }

  /** Sleep after `idleSeconds` unused (`null`: never), woken by the next use unless
   * `wakeOnUse` is false. */
  async setIdle(idleSeconds: number | null, o: { wakeOnUse?: boolean } = {}): Promise<void> {
    const body = { idle: null, ...idleBody(idleSeconds, o.wakeOnUse) };
    this.info = await this.rt.t.json("PUT", `/sandboxes/${this.id}/idle`, { json: body });
  }

  async setTtl(ttlSeconds: number): Promise<void> {
    this.info = await this.rt.t.json("POST", `/sandboxes/${this.id}/ttl`, { json: { ttl_seconds: ttlSeconds } });
  }

  /** Deletes the sandbox and its VM; one already gone is no error. */
  async stop(): Promise<void> {
    try {
      await this.rt.t.json("DELETE", `/sandboxes/${this.id}`);
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.persistent) await this.stop();
  }
}

/** A command started with `Sandbox.start`. */
export class DetachedCommand {
  constructor(
    private readonly rt: Runtime,
    readonly sandboxId: string,
    readonly id: string,
    private readonly timeoutMs?: number,
  ) {}

  private get route(): string {
    return `/sandboxes/${this.sandboxId}/commands/${this.id}`;
  }

  /** Waits for the command to end; its output from the start (as much as is kept). */
  wait(o: Pick<ExecOptions, "onStdout" | "onStderr"> = {}): Promise<ExecResult> {
    return collect(this.rt.t.events<WireEvent>("GET", this.route + "/events"), {
      ...o,
      timeoutMs: this.timeoutMs,
    });
  }

  /** Whether it has ended. */
  async done(): Promise<boolean> {
    const reply = await this.rt.t.json<{ exit: unknown }>("GET", this.route);
    return reply.exit !== null && reply.exit !== undefined;
  }

  async kill(signal = 15): Promise<void> {
    const res = await this.rt.t.request("POST", this.route + "/signal", { json: { signal } });
    res.resume();
  }
}

/** Files of a sandbox. Relative guest paths are taken from `/root`. */
/** A port forward in force (the daemon's `PortView`). */
export interface PortForward {
  guest_port: number;
  host_port: number;
  address: string;
  url: string;
}

/** Ports of a sandbox reached from this host: connections to the forward's host port reach
 * the guest's 127.0.0.1:PORT (HTTP, WebSocket or plain TCP), until closed or the sandbox goes. */
export class Ports {
  constructor(
    private readonly rt: Runtime,
    private readonly id: string,
  ) {}

  /** Starts a forward; its URL (`http://127.0.0.1:HOST_PORT/`). */
  async forward(guestPort: number, o: { hostPort?: number; address?: string } = {}): Promise<string> {
    return (await this.open(guestPort, o)).url;
  }

  /** Starts a forward; all of it. */
  open(guestPort: number, o: { hostPort?: number; address?: string } = {}): Promise<PortForward> {
    if (!Number.isInteger(guestPort) || guestPort < 1 || guestPort > 65535) {
      throw new ForkboxError(`guestPort ${guestPort}: give a port from 1 to 65535`);
    }
    const body: Record<string, unknown> = { guest_port: guestPort };
    if (o.hostPort !== undefined) body.host_port = o.hostPort;
    if (o.address !== undefined) body.address = o.address;
    return this.rt.t.json<PortForward>("POST", `/sandboxes/${this.id}/ports`, { json: body });
  }

  list(): Promise<PortForward[]> {
    return this.rt.t.json<PortForward[]>("GET", `/sandboxes/${this.id}/ports`);
  }

  async close(hostPort: number): Promise<void> {
    await this.rt.t.json("DELETE", `/sandboxes/${this.id}/ports/${hostPort}`);
  }
}

export class Files {
  constructor(
    private readonly rt: Runtime,
    private readonly id: string,
  ) {}

  readBytes(path: string): Promise<Buffer> {
    return this.rt.t.bytes("GET", `/sandboxes/${this.id}/files`, { path });
  }

  async readText(path: string): Promise<string> {
    return (await this.readBytes(path)).toString("utf8");
  }

  async writeBytes(path: string, data: Buffer | Uint8Array, mode = 0o644): Promise<number> {
    const reply = await this.rt.t.json<{ bytes: number }>("PUT", `/sandboxes/${this.id}/files`, {
      query: { path, mode: mode.toString(8) },
      body: Buffer.from(data),
    });
    return reply.bytes;
  }

  writeText(path: string, text: string, mode = 0o644): Promise<number> {
    return this.writeBytes(path, Buffer.from(text, "utf8"), mode);
  }

  async list(path: string): Promise<DirEntry[]> {
    const reply = await this.rt.t.json<{ entries: DirEntry[] }>("GET", `/sandboxes/${this.id}/dir`, {
      query: { path },
    });
    return reply.entries;
  }

  /** Copies the host directory `dir` into `dest` (made if missing) as one compressed archive;
   * the bytes sent. */
  async upload(dir: string, dest: string): Promise<number> {
    let body: Buffer;
    try {
      body = await packDir(dir);
    } catch (e) {
      throw new ForkboxError((e as Error).message);
    }
    const reply = await this.rt.t.json<{ bytes: number }>("PUT", `/sandboxes/${this.id}/archive`, {
      query: { path: dest, format: "tar.gz" },
      body,
    });
    return reply.bytes;
  }
}
