"""Diffract's durable ``local`` storage profile (see :mod:`diffract_storage_local.store`).

``Session(profile="local")`` keeps everything under ``./.diffract/``;
``Session(profile="local", path=...)`` anywhere else.
"""

from diffract_storage_local.store import LocalStore

__version__ = "0.1.0"

__all__ = ["LocalStore", "__version__"]
