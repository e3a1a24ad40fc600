"""Number and status formatting."""
import enum
import locale


class Level(enum.IntEnum):
    DEBUG = 10
    INFO = 20
    WARNING = 30
    ERROR = 40


def label(level):
    """'Level.INFO' -> the message prefix 'INFO'."""
    return str(Level(level)).split(".")[-1]


def grouped(number):
    """1234567 -> '1,234,567' in the C locale's style, with an explicit comma."""
    locale.setlocale(locale.LC_NUMERIC, "C")
    plain = locale.format("%d", number)
    out = []
    for i, ch in enumerate(reversed(plain)):
        if i and i % 3 == 0:
            out.append(",")
        out.append(ch)
    return "".join(reversed(out))


def parse_big(digits):
    """An int from a (possibly very long) decimal string."""
    return int(digits)


def digit_count(n):
    return len(str(abs(n)))
