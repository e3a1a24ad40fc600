"""The OpenAI Agents SDK's E2B sandbox client (`openai-agents[e2b]` from PyPI), unchanged, driving
a forkbox sandbox through its own session layer, without a model: create a session, start it
(its workspace made), exec, write and read files, list, stop and close.

Run by crates/cli/tests/e2b.rs with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL set.
"""

import asyncio
import io
import os
import time
from pathlib import Path

from agents.extensions.sandbox.e2b import (
    E2BSandboxClient,
    E2BSandboxClientOptions,
    E2BSandboxType,
)

TEMPLATE = os.environ.get("E2B_TEMPLATE", "base")


def ok(step, since):
    print(f"ok: {step} ({time.time() - since:.1f} s)", flush=True)


async def main():
    t = time.time()
    client = E2BSandboxClient()
    session = await client.create(
        options=E2BSandboxClientOptions(
            sandbox_type=E2BSandboxType.E2B,
            template=TEMPLATE,
            timeout=600,
            metadata={"suite": "openai-agents"},
        )
    )
    ok("E2BSandboxClient.create", t)
    try:
        t = time.time()
        await session.start()
        ok("session.start (the workspace made)", t)

        t = time.time()
        r = await session.exec("echo from-agents; uname -s")
        assert r.ok(), (r.exit_code, r.stderr)
        assert r.stdout.decode().split() == ["from-agents", "Linux"], r.stdout
        r = await session.exec("exit 7")
        assert r.exit_code == 7, r.exit_code
        ok("session.exec (output and exit codes)", t)

        t = time.time()
        await session.write(Path("notes/plan.md"), io.BytesIO(b"# plan\nport it\n"))
        back = await session.read(Path("notes/plan.md"))
        assert back.read() == b"# plan\nport it\n"
        names = [e.path for e in await session.ls(Path("notes"))]
        assert any(str(n).endswith("plan.md") for n in names), names
        r = await session.exec("cat notes/plan.md | wc -l")
        assert r.stdout.decode().strip() == "2", r.stdout
        ok("session.write, read, ls, and a command that sees the file", t)

        t = time.time()
        assert await session.running()
        ok("session.running", t)
    finally:
        t = time.time()
        await session.stop()
        await session.shutdown()
        ok("session.stop and shutdown", t)
    print("openai-agents e2b session passed", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
