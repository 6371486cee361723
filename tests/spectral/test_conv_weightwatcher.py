"""Convolutions under the weightwatcher preset, every column (issue 76.5): WeightWatcher
0.7.7 reads a Conv2d weight as its kh*kw kernel-position matrices [out, in], each scaled
by sqrt(1/2), and reports every number of the row from them (N, M and Q theirs,
num_evals and matrix_rank over the pooled eigenvalues, sv_max, the Marchenko-Pastur fit
of the pooled ESD, num_traps from each position shuffled on its own). Under the preset
ours are its numbers on a small CNN with 3x3, 5x5 and 1x1 convolutions and a linear
layer; WeightWatcher runs in its own process, as in test_conventions.py."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from diffract import Session

#: WeightWatcher's columns checked row by row: relative tolerance (0: equal).
EXACT = {"num_evals": 0, "M": 0, "N": 0, "Q": 1e-12, "matrix_rank": 0, "rank_loss": 0,
         "weak_rank_loss": 0, "sv_max": 1e-9, "mp_softrank": 1e-6, "num_spikes": 0,
         "alpha": 1e-9, "xmin": 1e-9, "D": 1e-9, "stable_rank": 1e-9, "entropy": 1e-6,
         "lambda_max": 1e-9, "norm": 1e-9, "log_norm": 1e-9, "alpha_weighted": 1e-9,
         "log_spectral_norm": 1e-9, "num_pl_spikes": 0}
SEEDS = 10


def _cnn(folder):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3), torch.nn.Conv2d(32, 24, 5),
                              torch.nn.Conv2d(24, 40, 1), torch.nn.Flatten(),
                              torch.nn.Linear(40, 64))
    with torch.no_grad():  # heavier tails than the initialisation's
        for p in net.parameters():
            if p.dim() > 1:
                p.add_(torch.randn_like(p).pow(3) * 0.05)
    path = folder / "cnn.safetensors"
    save_file({k: v.detach().contiguous() for k, v in net.state_dict().items()}, str(path))
    return path, {f"{i}.weight": net[i].weight.detach().double().numpy() for i in (0, 1, 2)}


def _theirs(path) -> tuple[dict, dict]:
    """One analyze(mp_fit=True, randomize=True) row per layer, and num_traps of SEEDS
    more runs (numpy's global generator seeded 0..SEEDS-1: it shuffles with it)."""
    script = f"""
import json, logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
import numpy as np
import weightwatcher as ww
from safetensors.torch import load_file
w = ww.WeightWatcher(model=load_file(sys.argv[1]))
runs = []
for seed in range({SEEDS}):
    np.random.seed(seed)
    d = w.analyze(mp_fit=True, randomize=True)
    runs.append({{n: float(d["num_traps"][i]) for i, n in enumerate(d["name"])}})
cols = {list(EXACT) + ["sv_min"]!r}
rows = {{n: {{c: float(d[c][i]) for c in cols}} for i, n in enumerate(d["name"])}}
print(json.dumps([rows, runs]))
"""
    run = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                         text=True)
    rows, runs = json.loads(run.stdout.strip().splitlines()[-1])
    return rows, {n: [r[n] for r in runs] for n in rows}


@pytest.mark.slow
def test_every_column_of_a_conv_row_is_weightwatchers(tmp_path):
    pytest.importorskip("weightwatcher")
    path, convs = _cnn(tmp_path)
    theirs, their_traps = _theirs(path)
    assert sorted(theirs) == ["0", "1", "2", "4"]
    ours, traps = {}, {n: [] for n in theirs}
    with Session() as s, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s.compute.configure_conventions("weightwatcher")
        s.models.add(str(path), model_id="m")
        s.compute.apply(*EXACT, "sv_min", errors="record")
        ours = s.results.export_metrics(*EXACT, "sv_min")["m"]
        for seed in range(SEEDS):
            s.compute.configure_kernel("esd_rand", seed=seed)
            s.compute.apply("num_traps", recompute="stale")
            for n, row in s.results.export_metrics("num_traps")["m"].items():
                traps[n.removesuffix(".weight")].append(row["num_traps"])
        s.registry.reset_configuration()
    for name, row in theirs.items():
        mine = ours[f"{name}.weight"]
        for col, rel in EXACT.items():
            assert mine[col] == pytest.approx(row[col], rel=rel, abs=0), (name, col)
    # the 3x3 conv: 9 positions of [32, 16] (576 eigenvalues in the 64->128 case)
    assert (ours["0.weight"]["num_evals"], ours["0.weight"]["N"]) == (144, 32)
    # sv_min: ours is the smallest pooled singular value; WeightWatcher 0.7.7 reports the
    # largest of the positions' smallest (its combined_eigenvalues keeps a running
    # np.max where the minimum is meant), which a 2-D layer's single matrix cannot show
    for name, w in convs.items():
        mins = [np.linalg.svd(w[:, :, i, j] * np.sqrt(0.5), compute_uv=False).min()
                for i in range(w.shape[2]) for j in range(w.shape[3])]
        assert ours[name]["sv_min"] == pytest.approx(min(mins), rel=1e-9), name
        assert theirs[name.removesuffix(".weight")]["sv_min"] == pytest.approx(
            max(mins), rel=1e-9), name
    assert ours["4.weight"]["sv_min"] == pytest.approx(theirs["4"]["sv_min"], rel=1e-9)
    # num_traps is a count over a random shuffle: its distributions over seeds agree
    # (before, a conv shuffled as one [out, in*kh*kw] matrix had 5-10x fewer)
    for name, counts in their_traps.items():
        a, b = np.array(traps[name]), np.array(counts)
        spread = 3 * np.sqrt((a.var(ddof=1) + b.var(ddof=1)) / SEEDS) + 1.0
        assert abs(a.mean() - b.mean()) <= spread, (name, a.mean(), b.mean())
