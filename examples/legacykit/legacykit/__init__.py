"""legacykit: small utilities written for Python 3.9, the way much real code still is.

It leans on modules and aliases that later Pythons removed (imp, distutils, asyncore, pipes,
imghdr, cgi, SafeConfigParser, collections.Mapping, inspect.getargspec, locale.format) and on
behaviour that later changed (IntEnum's str(), int() of very long strings, random.sample of a
set). Its test suite passes on 3.9 and fails on 3.13: forkbox's migration demo ports it.
"""

__version__ = "1.4.2"
