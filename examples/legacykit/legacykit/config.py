"""Reading INI configuration with defaults."""
import collections
import configparser
import io


def load(text, defaults=None):
    """A parser holding `text` (INI format), with optional defaults."""
    parser = configparser.SafeConfigParser(defaults=defaults or {})
    parser.readfp(io.StringIO(text))
    return parser


def as_dict(parser):
    """{section: {key: value}} of a parser."""
    return {s: dict(parser.items(s)) for s in parser.sections()}


def merge(base, override):
    """Deep merge of two nested mappings; values in `override` win."""
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, collections.Mapping) and isinstance(out.get(k), collections.Mapping):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out
