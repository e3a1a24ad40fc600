"""Agent frameworks that build on E2B, unchanged, against a forkbox daemon, each driven without
a model by calling its sandbox layer directly: smolagents' E2B executor (two cells that share
a variable, on E2B's code interpreter) or langchain-e2b's Deep Agents sandbox (a command, a
file written and read back). Run by crates/cli/tests/e2b.rs with E2B_API_KEY, E2B_API_URL and
E2B_SANDBOX_URL set:

    python frameworks.py smolagents | langchain
"""

import os
import sys
import time


def ok(step, since):
    print(f"ok: {step} ({time.time() - since:.1f} s)", flush=True)


def smolagents():
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import E2BExecutor

    t = time.time()
    ex = E2BExecutor(additional_imports=[], logger=AgentLogger(level=LogLevel.OFF), timeout=600)
    try:
        ok("smolagents' E2BExecutor made its sandbox (code-interpreter-v1)", t)
        t = time.time()
        out = ex("shared = 21")
        assert out.is_final_answer is False, out
        out = ex("print(shared * 2)")
        assert out.logs.strip() == "42", out.logs
        try:
            ex("undefined_name + 1")
            raise AssertionError("an error was not raised")
        except Exception as e:  # smolagents' AgentError
            assert "NameError" in str(e), e
        ok("two cells share a variable; an error comes back as the framework's", t)
    finally:
        ex.cleanup()
    print("smolagents e2b executor passed", flush=True)


def langchain():
    import e2b
    from langchain_e2b import E2BSandbox

    t = time.time()
    sbx = e2b.Sandbox.create(timeout=600)
    try:
        backend = E2BSandbox(sandbox=sbx, workdir="/home/user")
        ok(f"langchain-e2b's E2BSandbox over {backend.id}", t)
        t = time.time()
        r = backend.execute("echo hello > note.txt && cat note.txt && whoami")
        assert (r.exit_code, r.output.split()) == (0, ["hello", "user"]), r
        r = backend.execute("exit 7")
        assert r.exit_code == 7, r
        [d] = backend.download_files(["/home/user/note.txt"])
        assert (d.error, d.content) == (None, b"hello\n"), d
        [u] = backend.upload_files([("/home/user/up/data.txt", b"from the host")])
        assert u.error is None, u
        r = backend.execute("cat up/data.txt")
        assert r.output == "from the host", r
        [missing] = backend.download_files(["/home/user/nothing"])
        assert missing.error == "file_not_found", missing
        ok("a command, its exit code, a file read back, a file written, a missing file", t)
    finally:
        sbx.kill()
    print("langchain-e2b sandbox passed", flush=True)


if __name__ == "__main__":
    {"smolagents": smolagents, "langchain": langchain}[sys.argv[1]]()
    # The SDKs' native transports have aborted at the interpreter's teardown (see scenario.py).
    os._exit(0)
