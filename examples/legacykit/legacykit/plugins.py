"""A tiny plugin system: modules made from source text, hooks described by their arguments."""
import imp
import inspect


def module_from_source(name, source):
    """A new module called `name` holding the definitions in `source`."""
    mod = imp.new_module(name)
    exec(compile(source, "<plugin %s>" % name, "exec"), mod.__dict__)
    return mod


def hook_arguments(func):
    """The names of a hook's positional arguments."""
    return inspect.getargspec(func).args


def hooks(module, prefix="on_"):
    """{event: function} for the module's functions named on_<event>."""
    return {
        name[len(prefix):]: obj
        for name, obj in sorted(vars(module).items())
        if name.startswith(prefix) and callable(obj)
    }
