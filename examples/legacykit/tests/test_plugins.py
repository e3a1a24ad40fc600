from legacykit import plugins

SOURCE = """
def on_start(app, config):
    return "started " + app

def on_stop(app):
    return "stopped " + app

def helper():
    return 1
"""


def test_module_from_source():
    mod = plugins.module_from_source("demo", SOURCE)
    assert mod.__name__ == "demo"
    assert mod.helper() == 1


def test_hooks_are_found_by_prefix():
    mod = plugins.module_from_source("demo", SOURCE)
    assert sorted(plugins.hooks(mod)) == ["start", "stop"]


def test_hook_runs():
    mod = plugins.module_from_source("demo", SOURCE)
    assert plugins.hooks(mod)["start"]("web", {}) == "started web"


def test_hook_arguments():
    mod = plugins.module_from_source("demo", SOURCE)
    assert plugins.hook_arguments(mod.on_start) == ["app", "config"]


def test_hook_arguments_of_a_lambda():
    assert plugins.hook_arguments(lambda a, b=1: None) == ["a", "b"]
