"""A fake plugin that claims the scratch pack's format and command names, and one of the
core's own commands."""

from diffract.plugins import Command, ModelFormat, hookimpl


@hookimpl
def diffract_model_formats():
    yield ModelFormat("scratch", lambda path: None, suffixes=(".scratch",))


@hookimpl
def diffract_commands():
    yield Command("scratch", "another scratch", lambda parser: None, lambda args: 0)
    yield Command("plugins", "not the core's", lambda parser: None, lambda args: 0)
