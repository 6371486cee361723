"""Hook implementations: the ``local`` storage profile."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from diffract.errors import InvalidArgumentError
from diffract.plugins import StorageProfile, hookimpl

_OPTIONS = ("path", "timeout", "sync", "read_only")


def _local(options: Mapping[str, Any]) -> Any:
    from diffract_storage_local.store import LocalStore

    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise InvalidArgumentError(
            f"The 'local' profile got unknown option(s) {unknown}; it accepts "
            f"{list(_OPTIONS)} (path: the store directory, default ./.diffract; timeout: "
            "seconds to wait for another writer; sync: 'normal' or 'full'; read_only: True to "
            "only read, default: when the directory cannot be written)."
        )
    return LocalStore(**dict(options))


@hookimpl
def diffract_storage_profiles() -> Iterator[StorageProfile]:
    yield StorageProfile(
        name="local",
        factory=_local,
        description="SQLite under ./.diffract (or path=): survives the process and crashes; "
        "apply resumes.",
        durable=True,
    )
