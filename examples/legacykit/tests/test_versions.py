import unittest

import pytest

from legacykit import versions


@pytest.mark.parametrize("text,parts", [
    ("1.0", [1, 0]),
    ("1.10rc1", [1, 10, "rc", 1]),
    (" 2.3.4 ", [2, 3, 4]),
])
def test_parse(text, parts):
    assert versions.parse(text) == parts


@pytest.mark.parametrize("a,b,want", [
    ("1.0", "1.0", 0),
    ("1.2", "1.10", -1),
    ("2.0", "1.99", 1),
    ("1.0.1", "1.0", 1),
])
def test_compare(a, b, want):
    assert versions.compare(a, b) == want


def test_newest():
    assert versions.newest(["1.2", "1.10", "1.9"]) == "1.10"


def test_newest_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        versions.newest([])


class SatisfiesTest(unittest.TestCase):
    def test_minimum(self):
        self.assertEquals(versions.satisfies("3.9", "3.8"), True)
        self.assertEquals(versions.satisfies("3.7", "3.8"), False)
