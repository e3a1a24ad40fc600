"""Accept by comparison, with the Python SDK: record which tests pass on the old toolchain,
port in three forks on the new one, keep only ports that lost no test, smallest diff first.

    pip install ./sdk/python && python3 examples/sdk/accept.py
"""

import os
import re
import sys

from forkbox import Runtime

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.dirname(HERE)
TOOLS = ["python3", "python3-pytest", "git"]
PLANS = ["minimal", "modernize", "wrong"]  # deterministic porters: examples/plans/port.py
PYTEST = "python3 -m pytest -q -rA -p no:cacheprovider > /tmp/report.txt 2>&1; true"


def passed(report: str) -> set:
    return set(re.findall(r"^PASSED (\S+)", report, re.M))


def main() -> int:
    with Runtime() as rt:
        # Both toolchains pinned as images (rebuilt only when the recipe changes).
        legacy = rt.images.build("legacy", {"base": "bullseye", "apt": TOOLS}, if_changed=True)
        target = rt.images.build("target", {"base": "trixie", "apt": TOOLS}, if_changed=True)
        print(f"old toolchain {legacy.reference}, new {target.reference}")

        with rt.sandboxes.create(legacy.reference, ttl_seconds=900) as old:
            old.files.upload(os.path.join(EXAMPLES, "legacykit"), "/work")
            old.exec(PYTEST, cwd="/work")
            before = passed(old.files.read_text("/tmp/report.txt"))
        print(f"{len(before)} tests pass on {legacy.reference}")

        with rt.sandboxes.create(target.reference, ttl_seconds=900) as new:
            new.files.upload(os.path.join(EXAMPLES, "legacykit"), "/work")
            new.files.upload(os.path.join(EXAMPLES, "plans"), "/plan")
            new.exec(
                "git init -q && git add -A && git -c user.name=forkbox"
                " -c user.email=forkbox@localhost commit -qm before",
                cwd="/work",
            )
            copies = new.fork(count=3, ttl_seconds=900)
            accepted = []
            try:
                for plan, copy in zip(PLANS, copies):
                    copy.exec(["python3", "/plan/port.py", plan], cwd="/work")
                    copy.exec(PYTEST, cwd="/work")
                    lost = before - passed(copy.files.read_text("/tmp/report.txt"))
                    diff = copy.exec("git diff", cwd="/work").stdout
                    print(f"{plan:<10} lost {len(lost)} test(s), {len(diff.splitlines())} diff lines")
                    if not lost:
                        accepted.append((len(diff.splitlines()), plan))
            finally:
                for copy in copies:
                    copy.stop()
        accepted.sort()
        print("accepted, smallest diff first: " + ", ".join(p for _, p in accepted))
        return 0 if [p for _, p in accepted] == ["minimal", "modernize"] else 1


if __name__ == "__main__":
    sys.exit(main())
