import unittest

from legacykit import shell


def test_plain_words_are_not_quoted():
    assert shell.quote("hello") == "hello"


def test_spaces_are_quoted():
    assert shell.quote("a b") == "'a b'"


def test_single_quotes_survive():
    assert shell.quote("it's") == "'it'\"'\"'s'"


def test_join():
    assert shell.join(["ls", "-l", "my file"]) == "ls -l 'my file'"


def test_empty_argument():
    assert shell.quote("") == "''"


class EnvTest(unittest.TestCase):
    def test_env_prefix_sorted_and_quoted(self):
        self.assertEquals(shell.env_prefix({"B": "x y", "A": "1"}), "A=1 B='x y'")
