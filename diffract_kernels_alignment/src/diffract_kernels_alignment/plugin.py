"""Hook implementations: the alignment kernels, registered through the ``diffract`` group."""

from __future__ import annotations

from collections.abc import Iterator

from diffract.plugins import KernelSpec, hookimpl


@hookimpl
def diffract_kernels() -> Iterator[KernelSpec]:
    from diffract_kernels_alignment.kernels import ALL

    for fn in ALL:
        yield KernelSpec.from_function(fn)
