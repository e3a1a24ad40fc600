// Talking to the daemon: HTTP/1.1 over its Unix socket (or TCP with a bearer token), with
// Node's own `http`. No other runtime dependency.

import { execFile } from "node:child_process";
import * as fs from "node:fs";
import * as http from "node:http";
import * as https from "node:https";
import * as os from "node:os";
import * as path from "node:path";
import { StringDecoder } from "node:string_decoder";

import { DaemonNotRunningError, ForkboxError, errorOf } from "./errors.js";

/** Where the API is: `unix:/path`, `/path` or `http(s)://host:port`. */
export interface ConnectOptions {
  /** Defaults to `$FORKBOX_API`, then this host's daemon socket. */
  api?: string;
  /** Bearer token for a TCP API; defaults to `$FORKBOX_TOKEN`. */
  token?: string;
}

/** The daemon's socket: `$FORKBOX_HOME/forkbox.sock`, the home defaulting as the CLI's. */
export function defaultSocket(): string {
  let home = process.env.FORKBOX_HOME;
  if (!home) {
    home =
      typeof process.getuid === "function" && process.getuid() === 0
        ? "/var/lib/forkbox"
        : path.join(os.homedir(), ".local/share/forkbox");
  }
  return path.join(home, "forkbox.sock");
}

export class Transport {
  readonly socket?: string;
  readonly base: URL;
  private readonly token?: string;
  private readonly agent: http.Agent;
  // This host's own daemon (no address given) is started with `forkbox serve --detach` when it
  // does not answer, as the CLI's sandbox commands do; once.
  private readonly autostart: boolean;
  private starting?: Promise<void>;

  constructor(opts: ConnectOptions = {}) {
    let api = opts.api ?? process.env.FORKBOX_API ?? "";
    this.token = opts.token ?? process.env.FORKBOX_TOKEN ?? undefined;
    if (api.startsWith("http://") || api.startsWith("https://")) {
      this.base = new URL(api.replace(/\/+$/, "") + "/v1");
    } else {
      if (api.startsWith("unix:")) api = api.slice("unix:".length);
      if (api && !api.startsWith("/")) {
        throw new ForkboxError(
          `FORKBOX_API=${JSON.stringify(api)}: give unix:/path/to/socket or http://host:port`,
        );
      }
      this.socket = api || defaultSocket();
      this.base = new URL("http://forkbox/v1");
    }
    this.autostart = !api;
    this.agent =
      this.base.protocol === "https:"
        ? new https.Agent({ keepAlive: true })
        : new http.Agent({ keepAlive: true });
  }

  /** Frees the kept-alive connections (the process can then exit at once). */
  close(): void {
    this.agent.destroy();
  }

  private notRunning(cause: Error): ForkboxError {
    if (this.socket) {
      return new DaemonNotRunningError(
        `no forkbox daemon answers on ${this.socket} (${cause.message}); start one with ` +
          "`forkbox serve &` (any `forkbox sandbox` command also starts it), or point " +
          "FORKBOX_API at another",
      );
    }
    return new DaemonNotRunningError(`no forkbox API answers at ${this.base} (${cause.message})`);
  }

  private startDaemon(cause: Error): Promise<void> {
    const exe = (process.env.PATH ?? "")
      .split(":")
      .map((d) => path.join(d || ".", "forkbox"))
      .find((p) => fs.existsSync(p));
    if (!this.autostart || !exe) return Promise.reject(this.notRunning(cause));
    return new Promise((resolve, reject) => {
      execFile(exe, ["serve", "--detach"], { timeout: 120_000 }, (err, _out, stderr) => {
        if (!err) return resolve();
        reject(
          new DaemonNotRunningError(
            `no forkbox daemon answered on ${this.socket}, and \`forkbox serve --detach\` failed: ${String(stderr).trim() || err.message}`,
          ),
        );
      });
    });
  }

  /** Sends a request; resolves with the response once its head arrives (status < 400). */
  async request(
    method: string,
    route: string,
    opts: { query?: Record<string, string>; json?: unknown; body?: Buffer } = {},
  ): Promise<http.IncomingMessage> {
    try {
      return await this.send(method, route, opts);
    } catch (e) {
      if (!(e instanceof NotAnswering)) throw e;
      if (this.starting) throw this.notRunning(e.cause);
      this.starting = this.startDaemon(e.cause);
      await this.starting;
      try {
        return await this.send(method, route, opts);
      } catch (again) {
        throw again instanceof NotAnswering ? this.notRunning(again.cause) : again;
      }
    }
  }

  private send(
    method: string,
    route: string,
    opts: { query?: Record<string, string>; json?: unknown; body?: Buffer } = {},
  ): Promise<http.IncomingMessage> {
    const url = new URL(this.base.pathname + route, this.base);
    for (const [k, v] of Object.entries(opts.query ?? {})) url.searchParams.set(k, v);
    const headers: Record<string, string> = {};
    let payload: Buffer | undefined;
    if (opts.json !== undefined) {
      payload = Buffer.from(JSON.stringify(opts.json));
      headers["content-type"] = "application/json";
    } else if (opts.body !== undefined) {
      payload = opts.body;
      headers["content-type"] = "application/octet-stream";
    }
    if (payload) headers["content-length"] = String(payload.length);
    if (this.token) headers["authorization"] = `Bearer ${this.token}`;
    const lib = url.protocol === "https:" ? https : http;
    return new Promise((resolve, reject) => {
      const req = lib.request(
        {
          method,
          agent: this.agent,
          socketPath: this.socket,
          host: this.socket ? undefined : url.hostname,
          port: this.socket ? undefined : url.port,
          path: url.pathname + url.search,
          headers,
        },
        (res) => {
          if ((res.statusCode ?? 500) < 400) return resolve(res);
          readAll(res).then(
            (b) => reject(errorOf(res.statusCode ?? 500, b)),
            (e) => reject(e),
          );
        },
      );
      req.on("error", (e: NodeJS.ErrnoException) => {
        if (["ENOENT", "ECONNREFUSED", "EACCES"].includes(e.code ?? "")) {
          reject(new NotAnswering(e));
        } else {
          reject(new ForkboxError(`the request to the daemon failed: ${e.message}`));
        }
      });
      req.end(payload);
    });
  }

  async json<T>(
    method: string,
    route: string,
    opts: { query?: Record<string, string>; json?: unknown; body?: Buffer } = {},
  ): Promise<T> {
    const res = await this.request(method, route, opts);
    return JSON.parse((await readAll(res)).toString("utf8")) as T;
  }

  async bytes(method: string, route: string, query: Record<string, string>): Promise<Buffer> {
    return readAll(await this.request(method, route, { query }));
  }

  /** The NDJSON lines of a streamed answer, parsed. */
  async *events<T>(
    method: string,
    route: string,
    opts: { query?: Record<string, string>; json?: unknown } = {},
  ): AsyncGenerator<T> {
    const res = await this.request(method, route, opts);
    let rest = "";
    // A character split between two chunks is joined, not mangled.
    const text = new StringDecoder("utf8");
    for await (const chunk of res) {
      rest += text.write(chunk as Buffer);
      let nl: number;
      while ((nl = rest.indexOf("\n")) >= 0) {
        const line = rest.slice(0, nl).trim();
        rest = rest.slice(nl + 1);
        if (line) yield JSON.parse(line) as T;
      }
    }
    if (rest.trim()) yield JSON.parse(rest) as T;
  }
}

export async function readAll(res: http.IncomingMessage): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of res) parts.push(c as Buffer);
  return Buffer.concat(parts);
}

/** Nothing listens where the daemon should. */
class NotAnswering extends Error {
  constructor(readonly cause: Error) {
    super(cause.message);
  }
}
