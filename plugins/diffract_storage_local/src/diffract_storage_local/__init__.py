"""Diffract's durable ``local`` storage profile (see :mod:`diffract_storage_local.store`).

``Session(profile="local")`` keeps everything under ``./.diffract/``;
``Session(profile="local", path=...)`` anywhere else. The store's module (sqlite3 and
the rest) is imported when it is first used, not when the plugin is loaded."""

from __future__ import annotations

from typing import Any

__version__ = "0.2.0"

__all__ = ["LocalStore", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LocalStore":
        from diffract_storage_local.store import LocalStore

        return LocalStore
    raise AttributeError(f"module 'diffract_storage_local' has no attribute {name!r}")
