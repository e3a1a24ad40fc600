"""Building shell command lines safely."""
import pipes


def quote(arg):
    return pipes.quote(arg)


def join(argv):
    """One shell command line from an argument list."""
    return " ".join(quote(a) for a in argv)


def env_prefix(env):
    """`K=V ...` assignments for a command line, sorted by name."""
    return " ".join("%s=%s" % (k, quote(v)) for k, v in sorted(env.items()))
