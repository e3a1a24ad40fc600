"""Deterministic porters for the legacykit demo: `python3 port.py PLAN` edits the code in the
current directory. Every edit is an exact replacement that must match, so a port that no longer
fits the code fails loudly instead of half-applying.

Plans:
  minimal    the smallest set of changes that makes the suite pass on Python 3.13
  modernize  the same, and also modernises deprecated idioms (a bigger diff)
  wrong      like minimal, but compares versions as plain strings: it loses a test
"""
import sys

ECHO = '''"""A line-echo server on selectors (asyncore was removed in Python 3.12)."""
import selectors
import socket


class EchoServer:
    def __init__(self, host="127.0.0.1", port=0):
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.socket.listen(5)
        self.socket.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.socket, selectors.EVENT_READ, None)

    @property
    def port(self):
        return self.socket.getsockname()[1]

    def step(self, timeout):
        for key, _ in self.selector.select(timeout):
            if key.data is None:
                conn, _ = self.socket.accept()
                conn.setblocking(False)
                self.selector.register(conn, selectors.EVENT_READ, "conn")
            else:
                data = key.fileobj.recv(8192)
                if data:
                    key.fileobj.sendall(data.upper())
                else:
                    self.selector.unregister(key.fileobj)
                    key.fileobj.close()

    def close(self):
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()
        self.selector.close()


def serve_once(server, timeout=0.05, rounds=50):
    for _ in range(rounds):
        server.step(timeout)
'''

LOOSE = '''import re

_COMPONENT = re.compile(r"(\\d+ | [a-z]+ | \\.)", re.VERBOSE)


class LooseVersion:
    """distutils' LooseVersion (removed with distutils in Python 3.12)."""

    def __init__(self, text):
        parts = [p for p in _COMPONENT.split(text) if p and p != "."]
        self.version = [int(p) if p.isdigit() else p for p in parts]

    def __lt__(self, other):
        return self.version < other.version

    def __gt__(self, other):
        return self.version > other.version

    def __eq__(self, other):
        return self.version == other.version
'''

MINIMAL = [
    ("legacykit/versions.py", "from distutils.version import LooseVersion\n", LOOSE),
    ("legacykit/shell.py", "import pipes\n", "import shlex\n"),
    ("legacykit/shell.py", "return pipes.quote(arg)", "return shlex.quote(arg)"),
    ("legacykit/media.py", "import cgi\nimport imghdr\n", "from email.message import Message\n"),
    ("legacykit/media.py", "    return imghdr.what(None, h=data)\n",
     "    if data.startswith(b\"\\x89PNG\\r\\n\\x1a\\n\"):\n        return \"png\"\n"
     "    if data[:6] in (b\"GIF87a\", b\"GIF89a\"):\n        return \"gif\"\n"
     "    if data[:3] == b\"\\xff\\xd8\\xff\":\n        return \"jpeg\"\n    return None\n"),
    ("legacykit/media.py", "    value, params = cgi.parse_header(header)\n",
     "    msg = Message()\n    msg[\"content-type\"] = header\n    found = msg.get_params()\n"
     "    value, params = found[0][0], dict(found[1:])\n"),
    ("legacykit/config.py", "configparser.SafeConfigParser(", "configparser.ConfigParser("),
    ("legacykit/config.py", "parser.readfp(", "parser.read_file("),
    ("legacykit/config.py", "import collections\n", "import collections.abc\n"),
    ("legacykit/config.py", "isinstance(v, collections.Mapping) and isinstance(out.get(k), collections.Mapping)",
     "isinstance(v, collections.abc.Mapping) and isinstance(out.get(k), collections.abc.Mapping)"),
    ("legacykit/plugins.py", "import imp\nimport inspect\n", "import inspect\nimport types\n"),
    ("legacykit/plugins.py", "imp.new_module(name)", "types.ModuleType(name)"),
    ("legacykit/plugins.py", "inspect.getargspec(func).args", "inspect.getfullargspec(func).args"),
    ("legacykit/formatting.py", "import locale\n", "import locale\nimport sys\n"),
    ("legacykit/formatting.py", "return str(Level(level)).split(\".\")[-1]", "return Level(level).name"),
    ("legacykit/formatting.py", "locale.format(\"%d\", number)", "locale.format_string(\"%d\", number)"),
    ("legacykit/formatting.py", "    return int(digits)\n",
     "    if hasattr(sys, \"set_int_max_str_digits\"):\n        sys.set_int_max_str_digits(0)\n    return int(digits)\n"),
    ("legacykit/sampling.py", "rng.sample(items, k)",
     "rng.sample(sorted(items) if isinstance(items, (set, frozenset)) else items, k)"),
    ("tests/test_versions.py", "self.assertEquals(", "self.assertEqual("),
    ("tests/test_versions.py", "self.assertEquals(", "self.assertEqual("),
    ("tests/test_shell.py", "self.assertEquals(", "self.assertEqual("),
    ("tests/test_config.py", "self.assertEquals(", "self.assertEqual("),
]

MODERNIZE = MINIMAL + [
    ("legacykit/shell.py", "\"%s=%s\" % (k, quote(v))", "f\"{k}={quote(v)}\""),
    ("legacykit/plugins.py", "\"<plugin %s>\" % name", "f\"<plugin {name}>\""),
    ("legacykit/versions.py", "def parse(text):", "def parse(text: str) -> list:"),
    ("legacykit/versions.py", "def compare(a, b):", "def compare(a: str, b: str) -> int:"),
    ("legacykit/versions.py", "def satisfies(version, minimum):", "def satisfies(version: str, minimum: str) -> bool:"),
    ("legacykit/sampling.py", "def shuffled(items, seed=0):", "def shuffled(items, seed: int = 0) -> list:"),
    ("legacykit/formatting.py", "def digit_count(n):", "def digit_count(n: int) -> int:"),
]

WRONG = [e for e in MINIMAL if e[0] != "legacykit/versions.py"] + [
    # Drops distutils by comparing version strings as text: "1.10" < "1.2" then.
    ("legacykit/versions.py", "from distutils.version import LooseVersion\n",
     "def LooseVersion(text):\n    return text\n"),
    ("legacykit/versions.py", "    return LooseVersion(text.strip()).version\n",
     "    return [int(p) if p.isdigit() else p for p in text.strip().replace(\"rc\", \".rc.\").split(\".\") if p]\n"),
]

PLANS = {"minimal": MINIMAL, "modernize": MODERNIZE, "wrong": WRONG}


def apply(edits):
    for path, old, new in edits:
        with open(path) as f:
            text = f.read()
        if old not in text:
            sys.exit(f"port: {path}: expected text not found: {old!r}")
        with open(path, "w") as f:
            f.write(text.replace(old, new, 1))
    if any(p == "legacykit/netio.py" for p, _, _ in edits) is False:
        with open("legacykit/netio.py", "w") as f:
            f.write(ECHO)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PLANS:
        sys.exit(f"usage: port.py {{{','.join(PLANS)}}}")
    apply(PLANS[sys.argv[1]])
    print(f"port: plan {sys.argv[1]} applied")
