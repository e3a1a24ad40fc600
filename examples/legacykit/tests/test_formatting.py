import pytest

from legacykit import formatting


@pytest.mark.parametrize("level,name", [(10, "DEBUG"), (20, "INFO"), (40, "ERROR")])
def test_label(level, name):
    assert formatting.label(level) == name


def test_grouped():
    assert formatting.grouped(1234567) == "1,234,567"


def test_grouped_small():
    assert formatting.grouped(12) == "12"


def test_parse_big_number():
    digits = "7" * 5000
    assert formatting.digit_count(formatting.parse_big(digits)) == 5000


def test_parse_small_number():
    assert formatting.parse_big("42") == 42
