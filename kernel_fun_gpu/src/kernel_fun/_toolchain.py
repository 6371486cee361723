"""The toolchain that compiles kernel-fun's kernels on a device, and the combinations known
to compile Triton kernels wrong there.

fla's and Triton's own threads show that the toolchain, not the shapes, decides whether a
Triton kernel is right. :data:`KNOWN_BAD` is that knowledge as data: each entry names the
ops it concerns, the architectures, the tool versions it needs (``when``; ``unless``
excludes), what goes wrong and its public source. An entry without ``launch`` refuses the
whole op (:func:`refusal`: the call goes to fla, the reason to the log); an entry with
``launch`` names a kernel configuration (number of warps, tile sizes, kernels), and the
ops steer around it (:func:`steer` for KDA's fixed launches, :func:`allowed` for the
conv autotuner's choices) instead of giving up the op. The gate reads the toolchain once
per device and process; the per-key self-check (:mod:`kernel_fun._check`) catches what
the table does not list. To add an entry, append a dict;
tests/kernel_fun_gpu/test_toolchain.py checks its decisions with faked versions.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["KNOWN_BAD", "Toolchain", "allowed", "current", "refusal", "steer", "version"]

BOTH = ("causal_conv1d", "chunk_kda")
HOPPER = ((9, 0),)
#: Blackwell: B200/GB200, B300/GB300, Thor, RTX 50 / RTX PRO, GB10.
BLACKWELL = ((10, 0), (10, 3), (11, 0), (12, 0), (12, 1))
#: KDA's kernels that do the delta rule's backward (the gate backward is elementwise).
KDA_DELTA_BWD = ("_scan_bwd_kernel", "_dv_bwd_kernel", "_dk_bwd_kernel", "_dm_bwd_kernel",
                 "_intra_bwd_kernel")
#: Ours that does the work of fla's fused WY / dq-dk-dg backward kernel.
KDA_WY_DQKG = ("_dk_bwd_kernel",)

#: Combinations that compile wrong. ``when``/``unless``: {tool: (first, end)}, half-open
#: version ranges (end None: no end) of "triton", "ptxas" (the one Triton compiles this
#: arch with), "ptx" (the PTX ISA version it emits), "cuda" (torch's CUDA runtime) or
#: "fla"; ``launch``: the configuration it concerns ({setting: value or tuple of values},
#: "kernels": names), absent for the whole op.
KNOWN_BAD: tuple[dict[str, Any], ...] = (
    # fla issue 640: Triton 3.4.0 up to (not including) 3.7.1 miscompiles BK=64 tiles on
    # sm_90 (a dk error of 14.65 in chunk_kda's backward); our KDA kernels use BK=64 tiles.
    {"ops": ("chunk_kda",), "arch": HOPPER, "when": {"triton": ("3.4.0", "3.7.1")},
     "why": "Triton 3.4.0 up to 3.7.1 miscompiles BK=64 tiles on sm_90",
     "source": "https://github.com/fla-org/flash-linear-attention/issues/640"},
    # fla PR 1262: ptxas 12.8 generates wrong code for sm_90a (stock Triton 3.7.1 bundles
    # 12.8.93); 13.0 still writes shared memory wrongly; 13.1 passes.
    {"ops": BOTH, "arch": HOPPER, "when": {"ptxas": ("12.8", "12.9")},
     "why": "ptxas 12.8 generates wrong code for sm_90a",
     "source": "https://github.com/fla-org/flash-linear-attention/pull/1262"},
    {"ops": BOTH, "arch": HOPPER, "when": {"ptxas": ("13.0", "13.1")},
     "why": "ptxas 13.0 writes shared memory wrongly on sm_90a (13.1 passes)",
     "source": "https://github.com/fla-org/flash-linear-attention/pull/1262"},
    # triton PR 10787: plain (generic) shared stores assembled at PTX 8.5 to 8.9 (a CUDA
    # 12.5 to 12.9 ptxas) leave zeros on H100. 3.8.x emits explicit st.shared::cta stores
    # (compiled here: 3.8.0 with its ptxas 12.9 does); 3.9.0 emits plain stores, harmless
    # at its own ptxas's PTX 9.4 but not when TRITON_PTXAS_BLACKWELL_PATH names a 12.x.
    {"ops": BOTH, "arch": HOPPER, "when": {"ptx": ("8.5", "9.0")},
     "unless": {"triton": ("3.8", "3.9")},
     "why": "plain shared-memory stores assembled at PTX 8.5 to 8.9 leave zeros on H100",
     "source": "https://github.com/triton-lang/triton/pull/10787"},
    # fla issue 984, PR 988: the delta rule's backward at BT=64 with 4 warps gives wrong dk
    # / dbeta or an illegal access on H100, even with Triton 3.7.1 (all our KDA kernels
    # use BT=64 chunks; ours run these with 8 warps unless LAUNCH is changed).
    {"ops": ("chunk_kda",), "arch": HOPPER, "when": {},
     "launch": {"kernels": KDA_DELTA_BWD, "num_warps": 4},
     "why": "the delta rule's backward at BT=64 with 4 warps is wrong on H100",
     "source": "https://github.com/fla-org/flash-linear-attention/pull/988"},
    # triton issue 11366: an illegal shared read on Hopper for tl.dot kernels with 32-wide
    # K tiles and 4 warps under 3.6 to 3.8 (3.5.1 clean): exactly _intra_fwd's tiling.
    {"ops": ("chunk_kda",), "arch": HOPPER, "when": {"triton": ("3.6", "3.9")},
     "launch": {"BK": 32, "num_warps": 4},
     "why": "tl.dot kernels with BK=32 and 4 warps read shared memory out of bounds on sm_90",
     "source": "https://github.com/triton-lang/triton/issues/11366"},
    # fla issue 807: the fused WY / dq-dk-dg backward at BK=32 with 4 warps on Hopper.
    {"ops": ("chunk_kda",), "arch": HOPPER, "when": {},
     "launch": {"kernels": KDA_WY_DQKG, "BK": 32, "num_warps": 4},
     "why": "KDA's fused WY/dqkg backward at BK=32 with 4 warps is wrong on Hopper",
     "source": "https://github.com/fla-org/flash-linear-attention/issues/807"},
    # fla issue 1109: the same kernel at BK=32 with 4 or 8 warps on B200.
    {"ops": ("chunk_kda",), "arch": ((10, 0), (10, 3)), "when": {},
     "launch": {"kernels": KDA_WY_DQKG, "BK": 32, "num_warps": (4, 8)},
     "why": "KDA's fused WY/dqkg backward at BK=32 with 4 or 8 warps is wrong on B200",
     "source": "https://github.com/fla-org/flash-linear-attention/issues/1109"},
    # triton issue 10590, fla issue 1229: races in 8-warp kernels on Blackwell before 3.8.
    {"ops": BOTH, "arch": BLACKWELL, "when": {"triton": ("0", "3.8")},
     "launch": {"num_warps": 8},
     "why": "Triton before 3.8 races in 8-warp kernels on Blackwell",
     "source": "https://github.com/triton-lang/triton/issues/10590"},
    # triton issue 11032 (an integer abs miscompiled on sm_100) concerns no kernel of ours:
    # none takes abs of an integer (docs/kernel_fun.md).
)


def version(text: str | None) -> tuple[int, ...] | None:
    """The leading numbers of a version (``"3.7.1+git"`` -> (3, 7, 1)), or None."""
    if not text:
        return None
    found = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def _within(value: str | None, first: str, end: str | None) -> bool:
    have = version(value)
    if have is None:
        return False
    width = max(len(have), len(version(first) or ()), len(version(end) or ()))

    def pad(v: tuple[int, ...] | None) -> tuple[int, ...]:
        v = v or ()
        return v + (0,) * (width - len(v))

    return pad(version(first)) <= pad(have) and (end is None or pad(have) < pad(version(end)))


@dataclass(frozen=True)
class Toolchain:
    """What compiles and runs the kernels on one device (None: not known)."""

    device: str | None = None
    arch: tuple[int, int] | None = None
    triton: str | None = None
    ptxas: str | None = None
    cuda: str | None = None
    fla: str | None = None

    @property
    def ptx(self) -> str | None:
        """The PTX ISA version Triton emits for this ptxas (the newest it accepts, as
        Triton's ``ptx_get_version`` picks it): 12.x -> 8.x (8.(x-1) from 12.6 on),
        13.x -> 9.x."""
        have = version(self.ptxas)
        if not have or len(have) < 2:
            return None
        major, minor = have[:2]
        if major == 12:
            return f"8.{minor if minor < 6 else minor - 1}"
        if major >= 13:
            return f"{9 + major - 13}.{minor}"
        return None

    def describe(self) -> str:
        arch = f"sm_{self.arch[0]}{self.arch[1]}" if self.arch else "no GPU arch"
        return (f"{self.device or 'CPU'} ({arch}), Triton {self.triton or '?'}, ptxas "
                f"{self.ptxas or '?'} (PTX {self.ptx or '?'}), CUDA {self.cuda or '?'}, "
                f"fla {self.fla or '?'}")


_current: dict[str, Toolchain] = {}


def _ptxas(arch: tuple[int, int] | None) -> str | None:
    """The version of the ptxas Triton compiles ``arch`` with, as Triton picks it (3.9:
    ``ptxas-blackwell`` from sm_90 on, overridden only by TRITON_PTXAS_BLACKWELL_PATH;
    3.8: ``ptxas`` below sm_100, TRITON_PTXAS_PATH), or None where it cannot be read."""
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


def _holds(entry: dict[str, Any], op: str, toolchain: Toolchain) -> bool:
    """Whether ``entry`` concerns ``op`` under ``toolchain`` (configuration aside)."""
    archs = entry["arch"]
    archs = (archs,) if archs and isinstance(archs[0], int) else tuple(archs)
    if op not in entry["ops"] or toolchain.arch not in {tuple(a) for a in archs}:
        return False
    if not all(_within(getattr(toolchain, tool), *span)
               for tool, span in entry.get("when", {}).items()):
        return False
    return not any(_within(getattr(toolchain, tool), *span)
                   for tool, span in entry.get("unless", {}).items())


def _source(entry: dict[str, Any]) -> str:
    return f"{entry['why']} ({entry['source']})"


def refusal(op: str, toolchain: Toolchain) -> str | None:
    """Why ``op`` must not run its Triton kernels under ``toolchain`` at all (an entry of
    :data:`KNOWN_BAD` without a configuration holds, or the ptxas is not known), or None."""
    if toolchain.arch is not None and toolchain.ptxas is None:  # fail closed
        return (f"the version of the ptxas Triton compiles sm_{toolchain.arch[0]}"
                f"{toolchain.arch[1]} with could not be read, so kernel-fun cannot rule out "
                f"the ptxas versions known to compile wrong ({toolchain.describe()}); it "
                "uses fla. Point TRITON_PTXAS_PATH (Triton 3.8) or TRITON_PTXAS_BLACKWELL_PATH "
                "(3.9, sm_90 and newer) at a working ptxas.")
    for entry in KNOWN_BAD:
        if "launch" not in entry and _holds(entry, op, toolchain):
            return (f"{_source(entry)}; this device runs {toolchain.describe()}, so kernel-fun "
                    "uses fla. Upgrade the named tool past the range to use kernel-fun here.")
    return None


def _matches(launch: dict[str, Any], kernel: str, settings: dict[str, Any]) -> bool:
    for key, want in launch.items():
        have = kernel if key == "kernels" else settings.get(key)
        if have not in (want if isinstance(want, tuple) else (want,)):
            return False
    return True


_holding: dict[tuple, tuple] = {}
_holding_table: tuple = ()


def launch_entries(op: str, toolchain: Toolchain) -> tuple[dict[str, Any], ...]:
    """The configuration entries of :data:`KNOWN_BAD` that hold for ``op`` under
    ``toolchain`` (usually none), worked out once per table, op and toolchain: every
    launch asks."""
    global _holding_table
    if _holding_table is not KNOWN_BAD:  # a changed table (tests swap it) starts afresh
        _holding.clear()
        _holding_table = KNOWN_BAD
    found = _holding.get((op, toolchain))
    if found is None:
        found = _holding[(op, toolchain)] = tuple(
            e for e in KNOWN_BAD if "launch" in e and _holds(e, op, toolchain))
    return found


def bad_launch(op: str, kernel: str, settings: dict[str, Any],
               toolchain: Toolchain) -> dict[str, Any] | None:
    """The entry of :data:`KNOWN_BAD` that rules out launching ``kernel`` of ``op`` with
    ``settings`` (num_warps and tile sizes) under ``toolchain``, or None."""
    for entry in launch_entries(op, toolchain):
        if _matches(entry["launch"], kernel, settings):
            return entry
    return None


def allowed(op: str, kernel: str, configs: Iterable[Any], toolchain: Toolchain) -> list[Any]:
    """The autotuner ``configs`` (``triton.Config``) of ``kernel`` no entry rules out."""
    return [c for c in configs
            if bad_launch(op, kernel, {**c.kwargs, "num_warps": c.num_warps}, toolchain) is None]


def steer(op: str, kernel: str, settings: dict[str, Any], toolchain: Toolchain,
          largest_tile: int | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(settings, None)`` when no entry rules them out; else the nearest settings none
    rules out (other warps, 4 or 8, first, then a halved or doubled BK of at least 16 and
    at most ``largest_tile``, then 2 warps) and the entry steered around. Raises
    LookupError when none is left."""
    entry = bad_launch(op, kernel, settings, toolchain)
    if entry is None:
        return settings, None
    tiles = [settings.get("BK")]
    if "BK" in settings:
        bk = settings["BK"]
        tiles += [t for t in (bk // 2, bk * 2) if t >= 16 and t <= (largest_tile or bk)]
    warps = (settings.get("num_warps", 4), 4, 8)
    for tile, warp in [(t, w) for t in tiles for w in warps] + [(t, 2) for t in tiles]:
        other = dict(settings, num_warps=warp)
        if tile is not None:
            other["BK"] = tile
        if bad_launch(op, kernel, other, toolchain) is None:
            return other, entry
    raise LookupError(f"every launch of {kernel} near {settings} is ruled out here: "
                      f"{_source(entry)}")


def reset_for_tests() -> None:
    _current.clear()
    _holding.clear()
