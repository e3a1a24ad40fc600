"""forkbox's code interpreter server, in the sandbox on port 49999, as E2B's code interpreter
SDKs call it: `POST /execute` answers NDJSON lines (stdout, stderr, result, error,
number_of_executions, end_of_execution), `/contexts` creates, lists, restarts and removes
contexts, `/health` says OK. Each Python context is a Jupyter kernel (ipykernel) driven
through jupyter_client; bash cells run in a shell of their own per cell.

Limits: a cell runs at most FORKBOX_CELL_TIMEOUT seconds (300, or less when the request's
`timeout` says so; then the kernel is interrupted and the cell reports TimeoutError), its
output is cut past FORKBOX_CELL_OUTPUT bytes (10 MiB) with a marker, and a kernel that dies is
started again (the cell says so). Started as root with FORKBOX_CI_USER naming a user, it runs
as that user in their home (the `code-interpreter` image names `user`, as E2B's does).
A supervisor (this file without arguments) runs the server (`--serve`) and starts it again
whenever it ends after it had answered, as E2B's template has systemd do.
"""

import json
import os
import queue
import select
import socket
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jupyter_client.manager import KernelManager

PORT = int(os.environ.get("FORKBOX_CI_PORT", "49999"))
CELL_TIMEOUT = float(os.environ.get("FORKBOX_CELL_TIMEOUT", "300"))
CELL_OUTPUT = int(os.environ.get("FORKBOX_CELL_OUTPUT", str(10 << 20)))
# Linux's TCP states (tcp_states.h), as TCP_INFO's first byte gives them.
TCP_CLOSE, TCP_CLOSE_WAIT = 7, 8
MIME = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
    "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
    "application/javascript": "javascript",
    # Set by the formatters FORMATS_CODE registers in every Python kernel, as E2B's template's.
    "e2b/data": "data", "e2b/chart": "chart",
}


def expendable(pid):
    """Makes `pid` the one the guest's OOM killer takes first (a cell that fills memory costs
    its kernel, not the server)."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as f:
            f.write("800")
    except (OSError, TypeError):
        pass


def group(pgid):
    """The pids of process group `pgid`."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:
                    pids.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return pids


def note(what):
    """A line on the server's stderr (the daemon keeps its command's output)."""
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"


class Context:
    """One context: a language, a working directory, and for Python a kernel of its own."""

    def __init__(self, language, cwd):
        self.id = uuid.uuid4().hex
        self.language = language
        self.cwd = cwd
        # Held by the cell that runs; a restart in that cell takes it again.
        self.lock = threading.RLock()
        self.km = None
        self.kc = None
        self.node = None
        # The sandbox's variables its kernel was last given.
        self.env_seen = {}
        if language == "python":
            self.start()
        elif language in ("javascript", "typescript"):
            self.start_node()

    def start_node(self):
        self.node = subprocess.Popen(["node", "--expose-internals", "-e", NODE_DRIVER], cwd=self.cwd, text=True, bufsize=1,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=lambda: Cells.enter(self.id))
        expendable(self.node.pid)
        self.node_lines = queue.Queue()
        node, lines = self.node, self.node_lines

        def pump():
            for line in iter(node.stdout.readline, ""):
                lines.put(line)
            lines.put("")

        threading.Thread(target=pump, daemon=True).start()

    def view(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def pid(self):
        """The kernel's pid (it leads a process group of its own)."""
        prov = getattr(self.km, "provisioner", None)
        return getattr(prov, "pid", None) or getattr(getattr(self.km, "kernel", None), "pid", None)

    def start(self):
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=self.cwd)
        Cells.enter(self.id, self.pid())
        expendable(self.pid())
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        # One request for both (each is a round trip to the kernel, slow under emulation).
        quiet(self, CAP_CODE % CELL_OUTPUT + FORMATS_CODE)
        self.env_seen = {}

    def restart(self):
        with self.lock:
            if self.node is not None:
                self.shutdown()
                self.start_node()
            elif self.km is not None:
                self.shutdown()
                self.start()

    def strays(self):
        """Whether processes the kernel started (a fork bomb's) are left beside it."""
        pid = self.pid() if self.km is not None else None
        if not pid:
            return False
        if Cells.base is not None:
            try:
                with open(f"{Cells.base}/cells/{self.id}/cgroup.procs") as f:
                    return any(int(p) != pid for p in f.read().split())
            except (OSError, ValueError):
                pass
        return any(p != pid for p in group(pid))

    def shutdown(self):
        kernel = self.pid() if self.km is not None else None
        for pid in [kernel, self.node.pid if self.node else None]:
            if pid:
                try:
                    os.killpg(pid, 9)  # the kernel and all it started
                except OSError:
                    pass
        Cells.kill(self.id)  # and what left its process group
        if self.node is not None:
            self.node.kill()
            self.node.wait()
            self.node = None
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            self.km.shutdown_kernel(now=True)
        self.km = self.kc = None
        if kernel:
            try:
                os.waitpid(kernel, os.WNOHANG)  # a kernel that died is not left a zombie
            except ChildProcessError:
                pass


# A JavaScript context: one Node process that runs each cell as a script in one vm context
# (top-level declarations stay, as in a console), its console printing as the cell's output.
NODE_DRIVER = r"""
const vm = require('vm'), util = require('util'), readline = require('readline');
// The REPL's own rewriting of a top-level `await` (node runs with --expose-internals for it):
// the cell becomes an async function whose declarations stay the context's, as in node's REPL.
const { processTopLevelAwait } = require('internal/repl/await');
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const say = (kind) => (...a) => { out({ [kind]: util.format(...a) + '\n' }); };
const sandbox = { require, process, Buffer, setTimeout, clearTimeout, setInterval, clearInterval,
  __fbx_default: (m) => (m && m.__esModule && 'default' in m ? m.default : m),
  console: { log: say('stdout'), info: say('stdout'), debug: say('stdout'), warn: say('stderr'), error: say('stderr') } };
vm.createContext(sandbox);
// ES module imports at the start of a line, as E2B's JavaScript cells take them, become
// requires (node's built-in modules and CommonJS packages).
const bindings = (clause, from) => {
  const parts = [];
  const ns = clause.match(/^\*\s+as\s+([\w$]+)$/);
  if (ns) return `var ${ns[1]} = require(${from});`;
  const m = clause.match(/^([\w$]+)?\s*,?\s*(?:\{([^}]*)\}|\*\s+as\s+([\w$]+))?$/);
  if (!m) return null;
  if (m[1]) parts.push(`var ${m[1]} = __fbx_default(require(${from}));`);
  if (m[2] !== undefined) {
    const names = m[2].split(',').map((n) => n.trim()).filter(Boolean).map((n) => n.replace(/\s+as\s+/, ': '));
    parts.push(`var { ${names.join(', ')} } = require(${from});`);
  }
  if (m[3]) parts.push(`var ${m[3]} = require(${from});`);
  return parts.join(' ');
};
const imports = (code) => code.replace(/^([ \t]*)import\s+(?:([^'";]+?)\s+from\s+)?(['"][^'"]+['"])[ \t]*;?/gm,
  (all, indent, clause, from) => {
    if (clause === undefined) return `${indent}require(${from});`;
    const b = bindings(clause.trim().replace(/\s+/g, ' '), from);
    return b === null ? all : indent + b;
  });
// A TypeScript cell is JavaScript once its types are gone (Debian's esbuild strips them).
const fromTypeScript = (code) => {
  const r = require('child_process').spawnSync('esbuild', ['--loader=ts', '--log-level=error'], { input: code, encoding: 'utf8' });
  if (r.error) throw r.error;
  if (r.status !== 0) { const e = new SyntaxError((r.stderr || '').trim()); e.stack = ''; throw e; }
  return r.stdout;
};
readline.createInterface({ input: process.stdin }).on('line', async (line) => {
  const { code, base, envs, typescript } = JSON.parse(line);
  // The sandbox's variables stay; a cell's own are set for that cell alone.
  Object.assign(process.env, base || {});
  const saved = {};
  for (const [k, v] of Object.entries(envs || {})) { saved[k] = process.env[k]; process.env[k] = v; }
  try {
    const source = imports(typescript ? fromTypeScript(code) : code);
    let wrapped = null;
    if (source.includes('await')) {
      try { wrapped = processTopLevelAwait(source); } catch (e) { wrapped = null; }
    }
    let value = vm.runInContext(wrapped === null ? source : wrapped, sandbox, { filename: 'cell.js' });
    if (value && typeof value.then === 'function') value = await value;
    // A rewritten cell's last expression comes as { value } (node 16 and later).
    if (wrapped !== null && /return \{ value: /.test(wrapped)) value = value && value.value;
    // A string shows as its text, as E2B's JavaScript kernel shows it.
    if (value !== undefined) out({ result: typeof value === 'string' ? value : util.inspect(value) });
  } catch (e) {
    out({ error: { name: (e && e.name) || 'Error', value: (e && e.message) || String(e), traceback: (e && e.stack) || '' } });
  }
  for (const [k, v] of Object.entries(saved)) { if (v === undefined) delete process.env[k]; else process.env[k] = v; }
  out({ done: true });
});
"""

CONTEXTS = {}
DEFAULT = {}
STATE = threading.Lock()


# The sandbox's own environment variables (E2B's create `envs`), written by the E2B front to
# ENV_FILE after the server started (it starts in a warm snapshot, before any create): read
# again whenever the file changes, and given to every cell.
ENV_FILE = "/etc/e2b/env"
SANDBOX_ENV = {"mtime": None, "vars": {}}


def sandbox_env():
    try:
        mtime = os.stat(ENV_FILE).st_mtime_ns
    except OSError:
        return {}
    with STATE:
        if SANDBOX_ENV["mtime"] != mtime:
            out = subprocess.run(["env", "-i", "sh", "-c", f". {ENV_FILE} && env -0"],
                                 capture_output=True, timeout=30)
            pairs = (e.split(b"=", 1) for e in out.stdout.split(b"\0") if b"=" in e)
            got = {k.decode(): v.decode(errors="replace") for k, v in pairs}
            for k in ("PWD", "SHLVL", "_"):
                got.pop(k, None)
            SANDBOX_ENV.update(mtime=mtime, vars=got)
        return dict(SANDBOX_ENV["vars"])


# The languages a cell may be in, by the names E2B's SDKs give them.
LANGUAGES = {"python": "python", "bash": "bash", "javascript": "javascript", "js": "javascript",
             "typescript": "typescript", "ts": "typescript"}
UNKNOWN_LANGUAGE = "forkbox's code interpreter runs python, javascript, typescript and bash cells, not %s"


def language_of(name):
    """The language a cell's `language` names (Python when none), or None."""
    return LANGUAGES.get((name or "python").lower())


def context_for(language, context_id):
    with STATE:
        if context_id:
            return CONTEXTS.get(context_id)
        lang = (language or "python").lower()
        if lang not in DEFAULT:
            ctx = Context(lang, os.environ.get("HOME", "/home/user"))
            CONTEXTS[ctx.id] = ctx
            DEFAULT[lang] = ctx.id
        return CONTEXTS[DEFAULT[lang]]


class Output:
    """What a cell has printed so far, cut at CELL_OUTPUT bytes with a marker."""

    def __init__(self, send):
        self.send = send
        self.left = CELL_OUTPUT
        self.cut = False

    def text(self, kind, text):
        if self.left <= 0:
            if not self.cut:
                self.cut = True
                self.send({"type": "stderr", "text": f"\n[forkbox: output past {CELL_OUTPUT} bytes cut]\n", "timestamp": now()})
            return
        data = text.encode()
        if len(data) > self.left:
            text = data[: self.left].decode(errors="ignore")
        self.left -= len(data)
        self.send({"type": kind, "text": text, "timestamp": now()})
        if self.left <= 0:
            self.cut = True
            self.send({"type": "stderr", "text": f"\n[forkbox: output past {CELL_OUTPUT} bytes cut]\n", "timestamp": now()})

    def stopped(self):
        return {"type": "error", "name": "OutputLimitError",
                "value": f"the cell printed over {CELL_OUTPUT} bytes and was stopped", "traceback": ""}


def run_python(ctx, code, envs, send, limit):
    if ctx.kc is None or not ctx.km.is_alive():
        # It died between cells (a memory hog's last act, say): this cell runs on a new one.
        ctx.restart()
        send({"type": "stderr", "text": "[forkbox: the kernel had died and was started again; its state is gone]\n", "timestamp": now()})
    base = sandbox_env()
    if base != ctx.env_seen:
        quiet(ctx, f"__fbx_env({json.dumps(base)}, keep=True)")
        ctx.env_seen = base
    if envs:
        quiet(ctx, f"__fbx_env({json.dumps(envs)})")
    try:
        run_python_cell(ctx, code, send, limit)
    finally:
        if envs and ctx.kc is not None:
            quiet(ctx, "__fbx_env_back()")


def run_python_cell(ctx, code, send, limit):
    out = Output(send)
    # stop_on_error=False: ipykernel otherwise aborts, silently, a request that arrives within
    # stop_on_error_timeout of an error (the next cell an agent sends at once).
    msg_id = ctx.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
    deadline = time.monotonic() + limit
    while True:
        left = deadline - time.monotonic()
        if left <= 0 and ctx.strays():
            # Processes it started run on (a fork bomb): all of them go, and the kernel with them.
            note(f"context {ctx.id}: past {limit:g} s with processes beside the kernel; restarting it")
            ctx.restart()
            note(f"context {ctx.id}: restarted")
            send({"type": "error", "name": "TimeoutError", "traceback": "",
                  "value": f"the cell ran past {limit:g} s; it had started processes that ran on, so they were killed and its context started again (its state is gone)"})
            return
        if left <= 0:
            ctx.km.interrupt_kernel()
            send({"type": "error", "name": "TimeoutError", "value": f"the cell ran past {limit:g} s and was interrupted", "traceback": ""})
            drain(ctx, msg_id)
            settle(ctx)
            return
        try:
            msg = ctx.kc.get_iopub_msg(timeout=min(left, 1.0))
        except queue.Empty:
            if not ctx.km.is_alive():
                ctx.restart()
                send({"type": "error", "name": "KernelDied", "value": "the kernel died during the cell and was started again", "traceback": ""})
                return
            if send.gone():
                # Its client gave up (a timeout of its own): the cell is interrupted rather than
                # left to hold the context, so the next cell does not wait behind it.
                note(f"context {ctx.id}: the client left during a cell; interrupting it")
                ctx.km.interrupt_kernel()
                drain(ctx, msg_id)
                settle(ctx)
                raise BrokenPipeError("the client left")
            continue
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "stream":
            out.text("stdout" if content.get("name") == "stdout" else "stderr", content.get("text", ""))
            if out.cut:
                ctx.km.interrupt_kernel()
                drain(ctx, msg_id)
                settle(ctx)
                send(out.stopped())
                return
        elif kind in ("execute_result", "display_data"):
            data = content.get("data", {})
            result = {MIME[m]: v for m, v in data.items() if m in MIME}
            extra = {m: v for m, v in data.items() if m not in MIME}
            if extra:
                result["extra"] = extra
            result["type"] = "result"
            result["is_main_result"] = kind == "execute_result"
            send(result)
        elif kind == "error":
            send({"type": "error", "name": content.get("ename", ""), "value": content.get("evalue", ""),
                  "traceback": "\n".join(content.get("traceback", []))})
        elif kind == "execute_input":
            send({"type": "number_of_executions", "execution_count": content.get("execution_count", 0)})
        elif kind == "status" and content.get("execution_state") == "idle":
            return


def settle(ctx):
    """After a stopped cell: a kernel that left processes running (a fork bomb), or that does
    not answer, is started again with nothing of its own left."""
    if ctx.strays() or not ctx.km.is_alive():
        ctx.restart()


def drain(ctx, msg_id):
    """Reads the interrupted cell's last messages, up to its idle status."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            msg = ctx.kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["header"]["msg_type"] == "status" \
                and msg["content"].get("execution_state") == "idle":
            return


def run_node(ctx, code, envs, send, limit):
    if ctx.node is None or ctx.node.poll() is not None:
        ctx.start_node()
        send({"type": "stderr", "text": "[forkbox: the JavaScript context had ended and was started again; its state is gone]\n", "timestamp": now()})
    out = Output(send)
    ctx.node.stdin.write(json.dumps({"code": code, "base": sandbox_env(), "envs": envs or {},
                                     "typescript": ctx.language == "typescript"}) + "\n")
    ctx.node.stdin.flush()
    deadline = time.monotonic() + limit
    while True:
        left = deadline - time.monotonic()
        try:
            line = ctx.node_lines.get(timeout=max(left, 0.001)) if left > 0 else ""
        except queue.Empty:
            line, left = "", 0
        if not line:
            ctx.node.kill()
            ctx.start_node()
            send({"type": "error", "name": "TimeoutError" if left <= 0 else "KernelDied",
                  "value": "the JavaScript context ended during the cell and was started again", "traceback": ""})
            return
        msg = json.loads(line)
        if "stdout" in msg or "stderr" in msg:
            out.text("stdout" if "stdout" in msg else "stderr", msg.get("stdout", msg.get("stderr", "")))
            if out.cut:
                ctx.restart()
                send(out.stopped())
                return
        elif "result" in msg:
            send({"type": "result", "text": msg["result"], "is_main_result": True})
        elif "error" in msg:
            send({"type": "error", **msg["error"]})
        elif msg.get("done"):
            return


def run_shell(ctx, code, envs, send, limit):
    out = Output(send)
    env = {**os.environ, **sandbox_env(), **(envs or {})}
    p = subprocess.Popen(["/bin/bash", "-c", code], cwd=ctx.cwd, env=env, start_new_session=True,
                         preexec_fn=lambda: Cells.enter(ctx.id),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    expendable(p.pid)

    def kill():
        try:
            os.killpg(p.pid, 9)
        except OSError:
            pass

    def pump(stream, kind):
        for line in stream:
            if out.cut:
                continue
            out.text(kind, line)
            if out.cut:
                kill()

    threads = [threading.Thread(target=pump, args=(p.stdout, "stdout")),
               threading.Thread(target=pump, args=(p.stderr, "stderr"))]
    for t in threads:
        t.start()
    try:
        code_ = p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        kill()
        code_ = None
        send({"type": "error", "name": "TimeoutError", "value": f"the cell ran past {limit:g} s and was killed", "traceback": ""})
    for t in threads:
        t.join()
    kill()  # what it left running in the background
    if out.cut:
        send(out.stopped())
    elif code_:
        send({"type": "error", "name": "CommandExitError", "value": f"exit code {code_}", "traceback": ""})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, kind="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw or b"{}")

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, "OK")
        if self.path == "/contexts":
            with STATE:
                return self.reply(200, [c.view() for c in CONTEXTS.values()])
        self.reply(404, {"error": f"no {self.path}"})

    def do_DELETE(self):
        ctx_id = self.path.rstrip("/").rsplit("/", 1)[-1]
        with STATE:
            ctx = CONTEXTS.pop(ctx_id, None)
            for lang, cid in list(DEFAULT.items()):
                if cid == ctx_id:
                    del DEFAULT[lang]
        if ctx is None:
            return self.reply(404, {"error": f"no context {ctx_id}"})
        ctx.shutdown()
        self.reply(200, {})

    def do_POST(self):
        if self.path == "/contexts":
            req = self.body()
            lang = language_of(req.get("language"))
            if lang is None:
                return self.reply(400, {"error": UNKNOWN_LANGUAGE % req.get("language")})
            cwd = req.get("cwd") or os.environ.get("HOME", "/home/user")
            if not (os.path.isdir(cwd) and os.access(cwd, os.X_OK)):
                return self.reply(400, {"error": f"cwd {cwd}: not a directory the code interpreter's user can enter"})
            try:
                ctx = Context(lang, cwd)
            except Exception as e:  # a kernel that does not start: said, the server goes on
                return self.reply(500, {"error": f"the {lang} context did not start: {e}"})
            with STATE:
                CONTEXTS[ctx.id] = ctx
            return self.reply(200, ctx.view())
        if self.path.startswith("/contexts/") and self.path.endswith("/restart"):
            ctx = CONTEXTS.get(self.path.split("/")[2])
            if ctx is None:
                return self.reply(404, {"error": "no such context"})
            ctx.restart()
            return self.reply(200, ctx.view())
        if self.path == "/execute":
            return self.execute(self.body())
        self.reply(404, {"error": f"no {self.path}"})

    def execute(self, req):
        if req.get("context_id") and req.get("language"):
            return self.reply(400, {"error": "give a context or a language, not both"})
        lang = language_of(req.get("language"))
        if not req.get("context_id") and lang is None:
            return self.reply(400, {"error": UNKNOWN_LANGUAGE % req.get("language")})
        try:
            limit = min(float(req.get("timeout") or CELL_TIMEOUT), CELL_TIMEOUT)
        except (TypeError, ValueError):
            return self.reply(400, {"error": "timeout is not a number of seconds"})
        ctx = context_for(lang, req.get("context_id"))
        if ctx is None:
            return self.reply(404, {"error": f"no context {req.get('context_id')}"})
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(obj):
            line = (json.dumps(obj) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()

        def gone():
            """Whether the client closed its side (it sends nothing while it reads a cell): its
            FIN came (the socket is in CLOSE_WAIT; bytes it left unread before it, a request's
            trailing CRLF say, hide the end of the stream from a peek), or the stream ended."""
            try:
                state = self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
                if state in (TCP_CLOSE_WAIT, TCP_CLOSE):
                    return True
            except (OSError, AttributeError):
                pass
            try:
                ready, _, _ = select.select([self.connection], [], [], 0)
                return bool(ready) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        send.gone = gone

        try:
            with ctx.lock:
                run = {"python": run_python, "javascript": run_node, "typescript": run_node}.get(ctx.language, run_shell)
                run(ctx, req.get("code", ""), req.get("env_vars"), send, limit)
            send({"type": "end_of_execution"})
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass


def preload(ctx):
    """Loads the data stack into the default kernel once (no names bound, no execution
    counted), so that a warm sandbox's copies start with it in memory."""
    modules = os.environ.get("FORKBOX_CI_PRELOAD", "numpy,pandas,matplotlib.pyplot").split(",")
    quiet(ctx, "".join(f"__import__({m.strip()!r})\n" for m in modules if m.strip()))


def quiet(ctx, code):
    """Runs `code` in a context's kernel as no cell (nothing shown, nothing counted)."""
    msg_id = ctx.kc.execute(code, silent=True, store_history=False)
    try:
        ctx.kc.get_shell_msg(timeout=120)
    except queue.Empty:
        pass
    drain(ctx, msg_id)


# In every Python kernel: a cell's printed text is counted where it is written, and the write
# that would pass the limit raises OutputLimitError in the cell instead (its state kept). Cut
# at the source, a cell that prints without end queues nothing for the server to fall behind
# on (the kernel's outgoing queue once grew until the OOM killer took it).
CAP_CODE = """
def __fbx_cap(limit):
    from ipykernel.iostream import OutStream
    class OutputLimitError(Exception):
        pass
    written = [0]
    original = OutStream.write
    def write(self, text):
        written[0] += len(text)
        if written[0] > limit:  # and every write after it in this cell
            raise OutputLimitError(f"the cell printed over {limit} bytes and was stopped")
        return original(self, text)
    OutStream.write = write
    def reset(*_):
        written[0] = 0
    get_ipython().events.register("pre_run_cell", reset)
__fbx_cap(%d)
del __fbx_cap
# A str result shows as its text, as E2B's kernels show it (not its repr).
get_ipython().display_formatter.formatters["text/plain"].for_type(str, lambda o, p, cycle: p.text(o))
def __fbx_env(envs, keep=False):
    # Sets a cell's variables (saved, for __fbx_env_back), or with keep the sandbox's own.
    import os
    global __fbx_saved
    if not keep:
        __fbx_saved = {k: os.environ.get(k) for k in envs}
    os.environ.update(envs)
def __fbx_env_back():
    import os
    for k, v in globals().get("__fbx_saved", {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
"""

# In every Python kernel, the result formats E2B's code interpreter gives beside IPython's: a
# pandas DataFrame's columns as lists (`e2b/data`), a matplotlib figure's data (`e2b/chart`,
# by E2B's e2b_charts package, installed in the image), and an image a cell saves with PIL
# shown as a result. Each costs nothing until the cell uses its library.
FORMATS_CODE = r"""
def __fbx_formats():
    import importlib.util, sys
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, str)

        def __call__(self, obj):
            pd = sys.modules.get("pandas")
            if pd is None or not isinstance(obj, pd.DataFrame):
                return super().__call__(obj)
            columns = obj.to_dict(orient="list")
            return {k: [v.isoformat() if isinstance(v, pd.Timestamp) else v for v in vs]
                    for k, vs in columns.items()}

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict, str)

        def __call__(self, obj):
            if "matplotlib" not in sys.modules:
                return super().__call__(obj)
            from matplotlib.figure import Figure
            if not isinstance(obj, Figure):
                return super().__call__(obj)
            try:
                from e2b_charts import chart_figure_to_dict
                return chart_figure_to_dict(obj)
            except Exception:
                return {}

    shown = get_ipython().display_formatter
    shown.formatters["e2b/data"] = DataFormatter(parent=shown)
    shown.formatters["e2b/chart"] = ChartFormatter(parent=shown)

    def patch(image):
        save = image.Image.save
        def shown_save(self, fp, format=None, **params):
            if isinstance(fp, str):
                from IPython.display import display
                display(self)
            return save(self, fp, format, **params)
        image.Image.save = shown_save
        # No viewer to start in a sandbox: show() displays the image as a result instead.
        try:
            from PIL import ImageShow
            ImageShow.UnixViewer.show_file = lambda self, path, **options: 0
        except Exception:
            pass

    class OnImport:
        # Patches PIL.Image when a cell first imports it (or now, if it is loaded).
        def find_spec(self, name, path=None, target=None):
            if name != "PIL.Image":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module
            def exec_module(module):
                run(module)
                patch(module)
            spec.loader.exec_module = exec_module
            return spec

    if "PIL.Image" in sys.modules:
        patch(sys.modules["PIL.Image"])
    else:
        sys.meta_path.insert(0, OnImport())
__fbx_formats()
del __fbx_formats
"""


class Cells:
    """Cgroups (v2) that hold what cells run, apart from the server: under the supervisor's own
    cgroup (the agent's for its command), `supervisor` holds the supervisor, `server` the
    server and `cells/CONTEXT` each context's kernel and all it starts. `cells` may hold
    FORKBOX_CELL_PIDS processes (512) and has a tenth of the server's CPU weight, so a fork bomb
    stops at its limit, the server still answers, and a context's restart kills all it had
    (`cgroup.kill`), setsid or not. Without cgroup2 (or not started as root) cells run where
    the server does."""

    base = None

    @staticmethod
    def prepare(uid, gid):
        """Made once, by the supervisor (as root): the cgroups, the supervisor moved into its
        own. Returns their parent, or None."""
        def write(path, text):
            with open(path, "w") as f:
                f.write(text)

        try:
            with open("/proc/self/cgroup") as f:
                own = f.read().strip().split("::", 1)[1]
            if os.getuid() != 0 or own in ("", "/"):
                return None
            base = "/sys/fs/cgroup" + own
            for d in ("supervisor", "server", "cells"):
                os.makedirs(f"{base}/{d}", exist_ok=True)
            write(f"{base}/supervisor/cgroup.procs", str(os.getpid()))
            path = "/sys/fs/cgroup"
            for part in own.strip("/").split("/") + ["cells"]:
                for ctl in ("+pids", "+cpu"):
                    try:
                        write(f"{path}/cgroup.subtree_control", ctl)
                    except OSError:
                        if ctl == "+pids":
                            raise
                path = f"{path}/{part}"
            write(f"{base}/cells/pids.max", os.environ.get("FORKBOX_CELL_PIDS", "512"))
            try:
                write(f"{base}/cells/cpu.weight", "10")
            except OSError:
                pass
            if uid:
                os.chown(f"{base}/cgroup.procs", uid, gid)
                os.chown(f"{base}/cells", uid, gid)
            return base
        except (OSError, IndexError) as e:
            print(f"forkbox code server: cells run without cgroups of their own ({e})", file=sys.stderr, flush=True)
            return None

    @staticmethod
    def join(base):
        """Moves the server (still root) into its cgroup, and kills what the contexts of a
        server before it left running (it was killed; its kernels were not)."""
        if not base:
            return
        try:
            with open(f"{base}/server/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            print(f"forkbox code server: cells run without cgroups of their own ({e})", file=sys.stderr, flush=True)
            return
        Cells.base = base
        for ctx_id in os.listdir(f"{base}/cells"):
            if os.path.isdir(f"{base}/cells/{ctx_id}"):
                Cells.kill(ctx_id)
                for _ in range(50):
                    try:
                        os.rmdir(f"{base}/cells/{ctx_id}")
                        break
                    except OSError:
                        time.sleep(0.02)

    @staticmethod
    def enter(ctx_id, pid=0):
        """Moves process `pid` (0: the caller) into context `ctx_id`'s cgroup."""
        if Cells.base is None:
            return
        d = f"{Cells.base}/cells/{ctx_id}"
        try:
            os.makedirs(d, exist_ok=True)
            with open(f"{d}/cgroup.procs", "w") as f:
                f.write(str(pid))
        except OSError:
            pass

    @staticmethod
    def kill(ctx_id):
        """Kills every process of context `ctx_id`'s cgroup."""
        if Cells.base is None:
            return
        try:
            with open(f"{Cells.base}/cells/{ctx_id}/cgroup.kill", "w") as f:
                f.write("1")
        except OSError:
            pass


def account(user):
    """`user`'s uid, gid and home, or None when the server runs as whoever started it."""
    import pwd
    if not user or os.getuid() != 0:
        return None
    return pwd.getpwnam(user)


def become(user):
    """Runs the rest as `user` (in their home) when started as root."""
    pw = account(user)
    if pw is None:
        return
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("-500")  # the server outlives a cell that fills memory
    except OSError:
        pass
    os.initgroups(user, pw.pw_gid)
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    os.environ.update(HOME=pw.pw_dir, USER=user, LOGNAME=user)
    os.chdir(pw.pw_dir)


def supervise():
    """Runs the server and starts it again whenever it ends after it had answered (killed, say:
    E2B's template has systemd do the same). A server that ends before it answers cannot run
    here (an image without a Jupyter kernel): its exit is the supervisor's, for the daemon to
    report. A server that keeps ending is started at longer intervals, up to 5 s."""
    pw = account(os.environ.get("FORKBOX_CI_USER"))
    base = Cells.prepare(pw.pw_uid, pw.pw_gid) if pw else Cells.prepare(0, 0)
    pause = 0.2
    while True:
        ready_r, ready_w = os.pipe()
        env = {**os.environ, "FORKBOX_CI_READY_FD": str(ready_w), "FORKBOX_CI_CGROUP": base or ""}
        server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], pass_fds=(ready_w,), env=env)
        os.close(ready_w)
        with os.fdopen(ready_r, "rb") as r:
            ready = r.read(1) == b"r"  # the server's word, or its end
        started = time.monotonic()
        code = server.wait()
        if not ready:
            return code if code >= 0 else 128 - code
        pause = 0.2 if time.monotonic() - started > 60 else min(pause * 2, 5.0)
        note(f"the server ended ({'signal ' + str(-code) if code < 0 else 'exit ' + str(code)}); starting it again in {pause:g} s")
        time.sleep(pause)


def serve():
    Cells.join(os.environ.pop("FORKBOX_CI_CGROUP", None))
    become(os.environ.get("FORKBOX_CI_USER"))
    preload(context_for("python", None))
    # E2B lists a JavaScript context beside the Python one from the start.
    context_for("javascript", None)
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    server.daemon_threads = True
    ready = os.environ.pop("FORKBOX_CI_READY_FD", None)
    if ready:
        os.write(int(ready), b"r")
        os.close(int(ready))
    server.serve_forever()


def main():
    return serve() if sys.argv[1:] == ["--serve"] else supervise()


if __name__ == "__main__":
    sys.exit(main())
