"""forkbox's own Python SDK running code cells (`Sandbox.run_code`) against a daemon: run by
crates/cli/tests/e2b.rs with FORKBOX_API and FORKBOX_TOKEN set. Every step prints
`ok: STEP (S s)`; the first failure raises. Then hostile cells: one that prints without end,
one that fills memory, a fork bomb; after each the sandbox answers the next cell.
"""

import asyncio
import os
import re
import sys
import time

from forkbox import AsyncRuntime, BadRequest, Runtime


def ok(step, since):
    print(f"ok: {step} ({time.time() - since:.1f} s)", flush=True)


def cells(sbx):
    t = time.time()
    seen = []
    ex = sbx.run_code("x = 20\nprint('hi', flush=True)\nx + 1", on_stdout=seen.append)
    assert ex.error is None, ex.error
    assert (ex.text, ex.stdout, seen) == ("21", ["hi\n"], ["hi\n"]), ex
    assert sbx.run_code("x * 2").text == "40", "state kept"
    ok("the first cell (the code server started), state kept, stdout as it comes", t)

    t = time.time()
    ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()")
    pngs = [r.png for r in ex.results if r.png]
    assert len(pngs) == 1 and len(pngs[0]) > 1000, ex.results
    ex = sbx.run_code("def f():\n    return 1 / 0\nf()")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", ex.error.traceback if ex.error else "")  # Jupyter's colours
    assert ex.error and ex.error.name == "ZeroDivisionError" and "----> 3 f()" in plain, ex.error
    ex = sbx.run_code("import time\ntime.sleep(30)", timeout_seconds=2)
    assert ex.error and ex.error.name == "TimeoutError", ex.error
    assert sbx.run_code("x").text == "20", "state survives an error and a timeout"
    for i in range(20):  # a cell sent the moment an error comes back runs (ipykernel aborts it otherwise)
        assert sbx.run_code("1 / 0").error.name == "ZeroDivisionError"
        assert sbx.run_code(f"{i} + 1").text == str(i + 1), f"the cell after an error, round {i}"
    ok("a plot as PNG, an exception, a timeout", t)

    t = time.time()
    ctx = sbx.create_code_context(language="javascript", cwd="/tmp")
    assert (ctx.language, ctx.cwd) == ("javascript", "/tmp"), ctx
    assert sbx.run_code("let a = 2; a * 21", context=ctx).text == "42"
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.restart_code_context(ctx)
    assert sbx.run_code("typeof a", context=ctx).text == "undefined", "a restart forgets"
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]
    ex = sbx.run_code("echo $((6 * 7)); pwd", language="bash")
    assert ex.stdout == ["42\n", "/home/user\n"], ex.stdout
    try:
        sbx.run_code("1", language="ruby")
        raise AssertionError("ruby accepted")
    except BadRequest as e:
        assert "python, javascript, bash" in str(e), e
    ok("contexts (JavaScript), a bash cell, a language refused", t)


def forked(sbx):
    t = time.time()
    copies = sbx.fork(count=2)
    try:
        for i, c in enumerate(copies):
            c.run_code(f"x = x + {i + 1}")
        got = [c.run_code("x").text for c in copies] + [sbx.run_code("x").text]
        assert got == ["21", "22", "20"], got
    finally:
        for c in copies:
            c.stop()
    ok("a fork between cells: each copy's kernel has the state, then its own", t)


def hostile(sbx):
    t = time.time()
    sbx.run_code("kept = 'state'")
    ex = sbx.run_code("while True:\n    print('x' * (1 << 20))", timeout_seconds=60)
    assert ex.error and ex.error.name == "OutputLimitError" and "10485760" in ex.error.value, ex.error
    assert sum(len(s) for s in ex.stdout) <= 10 << 20, "the output is bounded"
    ex = sbx.run_code("kept")
    assert ex.text == "state", ex
    ex = sbx.run_code("print('y' * 100); 1 + 1")
    assert (ex.text, ex.stdout, ex.error) == ("2", ["y" * 100 + "\n"], None), ex
    ok("a cell that prints without end: stopped at 10 MiB, its state kept; the next cell prints", t)

    t = time.time()
    ex = sbx.run_code("hog = []\nwhile True:\n    hog.append(bytearray(64 << 20))", timeout_seconds=120)
    assert ex.error and ex.error.name in ("MemoryError", "KernelDied"), ex.error
    how = ex.error.name
    ex = sbx.run_code("1 + 2")
    assert ex.text == "3", ex
    ok(f"a cell that fills memory ({how}); the next cell answers", t)

    t = time.time()
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    ex = sbx.run_code(bomb, timeout_seconds=15)
    assert ex.error and ex.error.name == "TimeoutError" and "processes" in ex.error.value, ex.error
    ex = sbx.run_code("2 + 2")
    assert ex.text == "4", ex
    ok("a fork bomb: held at its limit, killed at its timeout with its context; the next cell answers", t)


async def concurrently():
    t = time.time()
    async with AsyncRuntime() as rt:
        sbx = await rt.sandboxes.create(image="code-interpreter", ttl_seconds=900)
        try:
            await sbx.run_code("n = 0")
            got = await asyncio.gather(*[sbx.run_code(f"{i} * 2", language="python") for i in range(4)])
            assert [e.text for e in got] == [str(i * 2) for i in range(4)], got
        finally:
            await sbx.stop()
    ok("the async client: cells asked for at once all answer", t)


def sleeps_with_its_server(rt):
    """A sandbox that sleeps when idle is not kept awake by its code server (which only waits
    for cells): it sleeps, and the next cell wakes it with the kernel's state."""
    t = time.time()
    with rt.sandboxes.create(image="code-interpreter", ttl_seconds=900, idle_seconds=3) as s:
        assert s.run_code("y = 41").error is None
        state = None
        for _ in range(180):
            state = rt.sandboxes.get(s.id).info["state"]
            if state == "sleeping":
                break
            time.sleep(0.5)
        assert state == "sleeping", state
        assert s.run_code("y + 1").text == "42", "the kernel's state after a sleep"
    ok("an idle sandbox sleeps with its code server running; the next cell wakes it", t)


def main():
    with Runtime() as rt:
        t = time.time()
        sbx = rt.sandboxes.create(image="code-interpreter", ttl_seconds=900)
        ok(f"create {sbx.id} (code-interpreter)", t)
        try:
            if "--only-hostile" not in sys.argv:
                cells(sbx)
                forked(sbx)
                sleeps_with_its_server(rt)
            if "hostile" in " ".join(sys.argv):
                hostile(sbx)
        finally:
            sbx.stop()
    asyncio.run(concurrently())
    print("forkbox python cells passed", flush=True)


if __name__ == "__main__":
    main()
