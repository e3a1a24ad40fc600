"""A pytest plugin forkbox's suite runner loads with `-p forkbox_outcomes`: it writes one JSON
line per test to the file named by FORKBOX_OUTCOMES once the test has ended, with its outcome
("passed", "failed", "skipped"), the phase that decided it and the first line of its error.
It changes nothing of how the tests run (with pytest-xdist the controller sees every worker's
reports, and only it writes)."""

import json
import os

_seen = {}
# With pytest-xdist each worker loads the plugin too: only the controller (or a run without
# workers) writes, once per test.
_writes = True


def pytest_configure(config):
    global _writes
    _writes = not hasattr(config, "workerinput")


def _write(nodeid, outcome, when, why):
    path = os.environ.get("FORKBOX_OUTCOMES")
    if not path or not _writes:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"test": nodeid, "outcome": outcome, "when": when, "why": why}) + "\n")


def _first_line(report):
    text = str(report.longrepr or "")
    for line in reversed(text.splitlines()):
        if line.startswith("E "):
            return line[1:].strip()[:300]
    return text.strip().splitlines()[-1][:300] if text.strip() else ""


def pytest_runtest_logreport(report):
    state = _seen.setdefault(report.nodeid, {"outcome": None, "when": "", "why": ""})
    if report.failed and state["outcome"] != "failed":
        state.update(outcome="failed", when=report.when, why=_first_line(report))
    elif report.skipped and state["outcome"] is None:
        state.update(outcome="skipped", when=report.when, why=_first_line(report))
    elif report.passed and report.when == "call" and state["outcome"] is None:
        state.update(outcome="passed", when="call")
    if report.when == "teardown":
        _write(report.nodeid, state["outcome"] or "failed", state["when"], state["why"])
