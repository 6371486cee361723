"""Export formats of ``session.results``: ``dict`` (nested, the default), ``list`` (one
record per row), ``pandas``, ``polars`` (optional: ``pip install polars``), ``csv`` and
``json`` (text, or written to ``path``), and any registered with
:func:`register_formatter`. JSON has no NaN or infinity: they are written as ``null``."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from diffract.errors import DiffractError, InvalidArgumentError, UnknownFormatError

__all__ = ["check_format", "emit", "plain_value", "register_formatter"]

Formatter = Callable[[list[dict[str, Any]], list[str]], Any]
_BUILTIN = ("dict", "list", "pandas", "polars", "csv", "json")
_FORMATTERS: dict[str, Formatter] = {}
_LOCK = threading.Lock()


def register_formatter(name: str, fn: Formatter) -> None:
    """Add an export format: ``fn(records, columns)`` receives the rows (dicts) and the
    column order and returns the export (process-global, like the kernel registry)."""
    if not isinstance(name, str) or not name or name in _BUILTIN:
        raise InvalidArgumentError(
            f"A formatter needs a new name, not {name!r} (built in: {list(_BUILTIN)})."
        )
    if not callable(fn):
        raise InvalidArgumentError(f"Formatter {name!r} must be callable, got {fn!r}.")
    with _LOCK:
        _FORMATTERS[name] = fn


def plain_value(value: Any) -> Any:
    """A JSON-friendly form of a stored value (or of records of them): arrays and tuples
    as lists, mappings item by item, NaN and infinities as None (JSON has no such
    numbers)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def check_format(export_format: str) -> None:
    """Raise :class:`~diffract.errors.UnknownFormatError` for a format nobody registered."""
    if export_format not in _BUILTIN and export_format not in _FORMATTERS:
        raise UnknownFormatError(export_format, [*_BUILTIN, *_FORMATTERS])


def emit(records: list[dict], columns: list[str], fmt: str, path: str | Path | None) -> Any:
    """``records`` (with ``columns`` in that order) in format ``fmt`` (a tabular one; the
    callers build ``dict`` themselves), written to ``path`` for csv and json when given."""
    if fmt in _FORMATTERS:
        return _FORMATTERS[fmt](records, columns)
    if fmt == "list":
        return [{c: r.get(c) for c in columns} for r in records]
    if fmt == "pandas":
        try:
            import pandas as pd
        except ImportError:
            raise DiffractError(
                "export_format='pandas' needs pandas: pip install 'diffractml-core[pandas]'."
            ) from None
        return pd.DataFrame.from_records(records, columns=columns)
    if fmt == "polars":
        try:
            import polars as pl
        except ImportError:
            raise DiffractError(
                "export_format='polars' needs polars: pip install polars."
            ) from None
        return pl.DataFrame([{c: plain_value(r.get(c)) for c in columns} for r in records],
                            schema=columns, strict=False)
    if fmt == "json":
        text = json.dumps([{k: plain_value(v) for k, v in r.items()} for r in records],
                          indent=1, allow_nan=False)
    else:
        import csv
        import io

        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for r in records:
            for k, v in r.items():
                if np.ndim(v) > 0:
                    raise InvalidArgumentError(
                        f"Column {k!r} holds arrays, which CSV cannot hold as numbers. "
                        "Leave the field out, or export it with export_format='json', "
                        "'dict', 'pandas' or 'polars'."
                    )
            writer.writerow(r)
        text = buf.getvalue()
    if path is None:
        return text
    Path(path).write_text(text)
    return Path(path)
