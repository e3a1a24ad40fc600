"""E2B's Template SDK against a forkbox daemon: a template built again unchanged is taken from
the first build (its log says CACHED, nothing runs), `skip_cache=True` builds it anew, and a
sandbox of it has what its steps made. Run by crates/cli/tests/e2b.rs with E2B's variables set;
argv[1]: the template's name, argv[2]: a folder for the COPY step's file.
"""

import os
import sys
import time

from e2b import Sandbox, Template

name, folder = sys.argv[1], sys.argv[2]
with open(os.path.join(folder, "data.txt"), "w") as f:
    f.write("copied\n")


def template():
    return (
        Template(file_context_path=folder)
        .from_template("base")
        .copy("data.txt", "/home/user/data.txt")
        .run_cmd("echo ran > /home/user/ran.txt")
    )


def build(**kw):
    logs = []
    t = time.time()
    info = Template.build(template(), name, on_build_logs=lambda e: logs.append(e.message), **kw)
    took = time.time() - t
    text = "\n".join(logs)
    print(f"build {info.build_id}: {took:.1f} s", flush=True)
    return text, took


first, t1 = build()
assert "CACHED" not in first, first
again, t2 = build()
assert "CACHED: all 2 step(s)" in again, again
print(f"ok: built again unchanged, cached ({t2:.1f} s; the first {t1:.1f} s)", flush=True)
forced, t3 = build(skip_cache=True)
assert "CACHED" not in forced and "skip_cache: every step runs" in forced, forced
print(f"ok: skip_cache built it anew ({t3:.1f} s)", flush=True)
s = Sandbox.create(template=name, timeout=120)
try:
    assert s.files.read("/home/user/data.txt") == "copied\n"
    assert s.files.read("/home/user/ran.txt") == "ran\n"
finally:
    s.kill()
print("template cache passed")
