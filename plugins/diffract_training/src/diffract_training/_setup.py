"""What a monitor sets up before training: the lock on its store, the heads' geometry."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diffract.errors import DiffractError

__all__ = ["head_geometry", "lock_store"]


def head_geometry(model: Any, views: Sequence[str]) -> dict[str, Any] | None:
    """The heads rule's geometry from a Hugging Face model's ``config`` (the monitor
    hands the core a mapping of tensors, which has no config.json beside it)."""
    config = getattr(model, "config", None)
    if "heads" not in views or config is None:
        return None
    found = {}
    for option, names in (("heads", ("num_attention_heads", "n_head")),
                          ("kv_heads", ("num_key_value_heads", "num_kv_heads")),
                          ("head_dim", ("head_dim",))):
        value = next((getattr(config, n) for n in names
                      if isinstance(getattr(config, n, None), int)), None)
        if value:
            found[option] = value
    return found or None


def lock_store(store: str | Path) -> Any:
    """An exclusive lock on ``<store>/.monitor.lock`` for the monitor's life: a store
    another run is writing is refused before training starts."""
    folder = Path(store)
    fh = open(folder / ".monitor.lock", "a")  # noqa: SIM115 - held until close()
    try:
        import fcntl

        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # pragma: no cover - no fcntl (Windows): no lock
        pass
    except BlockingIOError:
        fh.close()
        raise DiffractError(
            f"the store {str(folder)!r} is being written by another run (its "
            ".monitor.lock is held): give this run a store of its own.") from None
    return fh
