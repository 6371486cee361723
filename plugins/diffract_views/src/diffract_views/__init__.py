"""View rules for LLM-shaped models (see :mod:`diffract_views.rules`): ``heads``, ``qkv``,
``experts`` and ``conv``, turned on with ``models.add(..., views=[...])`` or ``diffract
analyze --views``."""

__version__ = "0.2.0"

__all__ = ["__version__"]
