"""The baseline-snapshot-fork loop with the Python SDK.

A trusted baseline sandbox is prepared once (the code in, a git baseline, bytecode compiled),
saved as a snapshot and hibernated; then each of three variants runs in its own fork, which is
gone when its `with` block ends, and the `git diff` of every variant whose tests pass is kept.

    pip install ./sdk/python && python3 examples/sdk/baseline_fork.py
"""

import os
import sys

from forkbox import Runtime

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.dirname(HERE)
IMAGE = os.environ.get("FORKBOX_EXAMPLE_IMAGE", "python-trixie")
VARIANTS = ["minimal", "modernize", "wrong"]  # examples/plans/port.py PLAN


def main() -> int:
    with Runtime() as rt:
        if IMAGE not in {i.name for i in rt.images.list()}:
            print(f"building {IMAGE} (Debian trixie, Python 3.13) once")
            rt.images.build(IMAGE, {"base": "trixie", "apt": ["python3", "python3-pytest", "git"]})
        base = rt.sandboxes.create(IMAGE, ttl_seconds=1800, labels={"role": "baseline"})
        base.files.upload(os.path.join(EXAMPLES, "legacykit"), "/work")
        base.files.upload(os.path.join(EXAMPLES, "plans"), "/plan")
        prep = base.exec(
            "git init -q && echo __pycache__/ > .git/info/exclude && git add -A"
            " && git -c user.name=forkbox -c user.email=forkbox@localhost commit -qm baseline"
            " && python3 -m compileall -q legacykit",
            cwd="/work",
        )
        assert prep.ok, prep.stderr
        baseline = base.snapshot()
        base.hibernate()
        print(f"baseline {base.id} saved as {baseline.name} and hibernated")

        kept = {}
        for variant in VARIANTS:
            with baseline.fork(ttl_seconds=900, labels={"role": "variant"}) as sbx:
                port = sbx.exec(["python3", "/plan/port.py", variant], cwd="/work")
                tests = sbx.exec("python3 -m pytest -q -p no:cacheprovider", cwd="/work")
                verdict = "pass" if port.ok and tests.ok else "fail"
                print(f"{variant:<10} {sbx.id}: {verdict} ({tests.stdout.strip().splitlines()[-1]})")
                if verdict == "pass":
                    kept[variant] = sbx.exec("git diff", cwd="/work").stdout

        left = rt.sandboxes.list(label="role=variant")
        print(f"forks left: {len(left)}")
        with baseline.fork(ttl_seconds=900) as again:
            untouched = again.exec("git status --porcelain | wc -l", cwd="/work").stdout.strip()
            print(f"the snapshot forks again: {again.id}, {untouched} changed file(s)")

        base.stop()
        baseline.delete()
        for variant, diff in sorted(kept.items(), key=lambda kv: len(kv[1])):
            print(f"kept {variant}: {len(diff.splitlines())} diff lines")
        ok = set(kept) == {"minimal", "modernize"} and not left and untouched == "0"
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
