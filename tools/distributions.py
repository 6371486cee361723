"""Regenerate ``diffract_core/src/diffract/distributions.json``: for each distribution of
this repository, where it lies in a checkout and what it provides (fields and their
aliases, commands, model formats, storage profiles, executors, views), read from the
installed plugins themselves.

The core reads the file to say what to install when something is missing (an unknown
field, a command, a format), with both forms: ``pip install NAME`` and, from a checkout,
``pip install ./PATH``. tests/core/test_install_hints.py fails when the file and the
installed plugins disagree: run this then.

    python tools/distributions.py
"""

from __future__ import annotations

import json
from pathlib import Path

from dists import distributions  # tools/, beside this file

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "diffract_core" / "src" / "diffract" / "distributions.json"


def paths() -> dict[str, str]:
    """Distribution name -> its folder relative to the repository's root (the core left
    out: nothing installs it to get a missing piece)."""
    return {d["name"]: d["folder"] for d in distributions() if d["folder"] != "diffract_core"}


def provided() -> dict[str, dict[str, list[str]]]:
    from diffract.plugins import get_catalog

    catalog = get_catalog()
    out: dict[str, dict[str, set[str]]] = {}

    def add(provider: str, kind: str, names) -> None:
        out.setdefault(provider.split(" ")[0], {}).setdefault(kind, set()).update(names)

    for spec in catalog.kernels:
        add(spec.provider, "fields", [*spec.produce_fields, *(a for a, _ in spec.aliases)])
    for kind in ("commands", "formats", "profiles", "executors", "views"):
        for name, thing in getattr(catalog, kind).items():
            add(getattr(thing, "provider", ""), kind, [name])
    return {d: {k: sorted(v) for k, v in kinds.items()} for d, kinds in out.items()}


def table() -> dict[str, dict]:
    where = paths()
    found = provided()
    return {name: {"path": path, **found.get(name, {})} for name, path in sorted(where.items())}


if __name__ == "__main__":
    TARGET.write_text(json.dumps(table(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {TARGET.relative_to(ROOT)}")
