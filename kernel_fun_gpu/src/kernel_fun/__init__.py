"""kernel-fun: Triton drop-ins for flash-linear-attention ops.

Importing this package is cheap: neither triton nor fla is imported until an op runs.

    from kernel_fun.cconv import causal_conv1d      # same contract as fla's
    from kernel_fun.kda import chunk_kda            # same contract as fla's
    import kernel_fun
    with kernel_fun.install():                       # adopt it inside fla
        ...
"""

from __future__ import annotations

from typing import Any

__version__ = "0.2.0"

__all__ = ["__version__", "install"]


def _say_if_shared() -> None:
    """One line on stderr when the package registry's ``kernel-fun`` (another library
    installing a package named ``kernel_fun``) installed files where this one is: pip
    lets the last one installed overwrite the other's files, and uninstalling either
    breaks the other. Reads the folder's listing (importlib.metadata costs more)."""
    import os

    folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        entries = [e for e in os.listdir(folder)
                   if e.endswith(".dist-info") and e.split("-")[0].lower() == "kernel_fun"]
    except OSError:
        return
    for entry in entries:
        try:
            with open(os.path.join(folder, entry, "RECORD"), encoding="utf-8") as record:
                if not any(line.startswith("kernel_fun/") for line in record):
                    continue
        except OSError:
            continue
        version = entry[: -len(".dist-info")].partition("-")[2]
        version = "".join(c for c in version if c.isalnum() or c in ".+")
        os.write(2, (f"kernel_fun: the package 'kernel_fun' here belongs to two distributions, "
                     f"diffractml-kernel-fun-gpu {__version__} and kernel-fun {version[:40]} "
                     f"(another library of the same import name), whose files overwrite each "
                     f"other; keep one: pip uninstall kernel-fun, then pip install "
                     f"--force-reinstall --no-deps diffractml-kernel-fun-gpu\n").encode())
        return


_say_if_shared()


def install(mode: str = "auto") -> Any:
    """Adopt kernel-fun's ops inside fla; see :func:`kernel_fun.adopt.install`."""
    from kernel_fun.adopt import install as _install

    return _install(mode=mode)
