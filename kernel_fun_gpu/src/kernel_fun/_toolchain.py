"""The toolchain that compiles kernel-fun's kernels on a device, and the combinations known
to compile Triton kernels wrong there.

fla's own threads show that on Hopper the toolchain, not the shapes, decides whether a
Triton kernel is right. :data:`KNOWN_BAD` is that knowledge as data: each entry names the
ops it concerns, the architecture, a half-open version range of one tool, what goes
wrong and its public source. The gate (:func:`refusal`) reads the toolchain once per
device and process and refuses an op on a listed combination, with the reason in the log;
the per-key self-check (:mod:`kernel_fun._check`) catches what the table does not list.
To add an entry, append a dict; tests/kernel_fun_gpu/test_toolchain.py checks its
decisions with faked versions.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["KNOWN_BAD", "Toolchain", "current", "refusal", "version"]

BOTH = ("causal_conv1d", "chunk_kda")

#: Combinations that compile wrong. ``tool``: "triton", "ptxas", "cuda" (the CUDA
#: runtime torch was built with) or "fla"; ``range``: [first, end) of its version.
KNOWN_BAD: tuple[dict[str, Any], ...] = (
    # fla issue 640: Triton 3.4.0 up to (not including) 3.7.1 miscompiles BK=64 tiles on
    # sm_90 (a dk error of 14.65 in chunk_kda's backward); our KDA kernels use BK=64 tiles.
    {"ops": ("chunk_kda",), "arch": (9, 0), "tool": "triton", "range": ("3.4.0", "3.7.1"),
     "why": "Triton 3.4.0 up to 3.7.1 miscompiles BK=64 tiles on sm_90",
     "source": "https://github.com/fla-org/flash-linear-attention/issues/640"},
    # fla PR 1262: ptxas 12.8 generates wrong code for sm_90a; 13.0 still writes shared
    # memory wrongly; 13.1 passes.
    {"ops": BOTH, "arch": (9, 0), "tool": "ptxas", "range": ("12.8", "12.9"),
     "why": "ptxas 12.8 generates wrong code for sm_90a",
     "source": "https://github.com/fla-org/flash-linear-attention/pull/1262"},
    {"ops": BOTH, "arch": (9, 0), "tool": "ptxas", "range": ("13.0", "13.1"),
     "why": "ptxas 13.0 writes shared memory wrongly on sm_90a (13.1 passes)",
     "source": "https://github.com/fla-org/flash-linear-attention/pull/1262"},
    # fla PR 988 (num_warps=4 giving wrong dk/dbeta or an illegal memory access on H100
    # even with Triton 3.7.1) names a launch setting, not a version: the self-check is
    # what catches it on a device, whatever the versions.
)


def version(text: str | None) -> tuple[int, ...] | None:
    """The leading numbers of a version (``"3.7.1+git"`` -> (3, 7, 1)), or None."""
    if not text:
        return None
    found = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def _within(value: str | None, first: str, end: str) -> bool:
    have = version(value)
    if have is None:
        return False
    width = max(len(have), len(version(first) or ()), len(version(end) or ()))

    def pad(v: tuple[int, ...] | None) -> tuple[int, ...]:
        v = v or ()
        return v + (0,) * (width - len(v))

    return pad(version(first)) <= pad(have) < pad(version(end))


@dataclass(frozen=True)
class Toolchain:
    """What compiles and runs the kernels on one device (None: not known)."""

    device: str | None = None
    arch: tuple[int, int] | None = None
    triton: str | None = None
    ptxas: str | None = None
    cuda: str | None = None
    fla: str | None = None

    def describe(self) -> str:
        arch = f"sm_{self.arch[0]}{self.arch[1]}" if self.arch else "no GPU arch"
        return (f"{self.device or 'CPU'} ({arch}), Triton {self.triton or '?'}, ptxas "
                f"{self.ptxas or '?'}, CUDA {self.cuda or '?'}, fla {self.fla or '?'}")


_current: dict[str, Toolchain] = {}


def _ptxas(arch: tuple[int, int] | None) -> str | None:
    """The version of the ptxas Triton compiles with for ``arch`` (its bundled one unless
    TRITON_PTXAS_PATH says otherwise), or None where it cannot be read."""
    try:
        from triton.backends.nvidia import compiler

        number = arch[0] * 10 + arch[1] if arch else 90
        if hasattr(compiler, "get_ptxas"):  # Triton 3.4+
            return str(compiler.get_ptxas(number).version)
        text = compiler.get_ptxas_version()  # "... release 12.8, V12.8.93"
        found = re.search(r"release (\d+\.\d+)", text)
        return found.group(1) if found else None
    except Exception:  # noqa: BLE001 - no CUDA backend, no ptxas: not known
        return None


def current(device: Any) -> Toolchain:
    """The toolchain for ``device`` (a torch device), read once per device and process."""
    import torch

    name = str(device)
    found = _current.get(name)
    if found is not None:
        return found
    arch = gpu = None
    if getattr(device, "type", None) == "cuda" and torch.cuda.is_available():
        arch = tuple(torch.cuda.get_device_capability(device))
        gpu = torch.cuda.get_device_name(device)
    triton = sys.modules.get("triton")
    if triton is None:
        try:
            import triton
        except ImportError:
            triton = None
    fla = sys.modules.get("fla")
    found = Toolchain(device=gpu, arch=arch, triton=getattr(triton, "__version__", None),
                      ptxas=_ptxas(arch) if arch else None, cuda=torch.version.cuda,
                      fla=getattr(fla, "__version__", None))
    _current[name] = found
    return found


def refusal(op: str, toolchain: Toolchain) -> str | None:
    """Why ``op`` must not run its Triton kernels under ``toolchain`` (an entry of
    :data:`KNOWN_BAD` matches), or None."""
    for entry in KNOWN_BAD:
        if op not in entry["ops"] or toolchain.arch != tuple(entry["arch"]):
            continue
        if _within(getattr(toolchain, entry["tool"]), *entry["range"]):
            return (f"{entry['why']} ({entry['source']}); this device runs "
                    f"{toolchain.describe()}, so kernel-fun uses fla. Upgrade the named tool "
                    "past the range to use kernel-fun here.")
    return None


def reset_for_tests() -> None:
    _current.clear()
