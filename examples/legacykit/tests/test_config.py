import unittest

from legacykit import config

TEXT = """
[server]
host = example.org
port = 8080

[client]
retries = 3
"""


def test_sections():
    assert config.load(TEXT).sections() == ["server", "client"]


def test_values():
    p = config.load(TEXT)
    assert p.get("server", "host") == "example.org"
    assert p.getint("server", "port") == 8080


def test_defaults_apply_to_every_section():
    p = config.load(TEXT, defaults={"timeout": "5"})
    assert p.get("client", "timeout") == "5"


def test_as_dict():
    assert config.as_dict(config.load(TEXT))["client"] == {"retries": "3"}


def test_merge_is_deep():
    base = {"a": {"x": 1, "y": 2}, "b": 1}
    assert config.merge(base, {"a": {"y": 3}}) == {"a": {"x": 1, "y": 3}, "b": 1}


def test_merge_replaces_non_mappings():
    assert config.merge({"a": 1}, {"a": {"b": 2}}) == {"a": {"b": 2}}


class MergeTest(unittest.TestCase):
    def test_merge_does_not_modify_its_inputs(self):
        base = {"a": {"x": 1}}
        config.merge(base, {"a": {"x": 2}})
        self.assertEquals(base, {"a": {"x": 1}})
