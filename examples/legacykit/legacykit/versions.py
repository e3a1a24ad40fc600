"""Version strings: parsing, comparing, picking the newest."""
from distutils.version import LooseVersion


def parse(text):
    """The version's parts, numbers as ints: '1.10rc1' -> [1, 10, 'rc', 1]."""
    return LooseVersion(text.strip()).version


def compare(a, b):
    """-1, 0 or 1 as version a is older than, equal to or newer than b."""
    va, vb = LooseVersion(a), LooseVersion(b)
    if va < vb:
        return -1
    if va > vb:
        return 1
    return 0


def newest(versions):
    """The newest of some version strings."""
    if not versions:
        raise ValueError("no versions given")
    return max(versions, key=LooseVersion)


def satisfies(version, minimum):
    return compare(version, minimum) >= 0
