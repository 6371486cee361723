"""Smoke tests run inside a fresh virtual environment that holds installed wheels only.

tests/wheels/test_wheels.py copies this file into the environment's folder and runs
``ENV/bin/python -I smoke.py CASE [ARGS]``: no PYTHONPATH, no user site, not this
repository's folder on the path. Each case first checks that every module it uses and
every ``diffract`` entry point comes from the environment's site-packages (a test that
reached the source tree instead of the installed wheel fails there), then uses the
installed distributions as a user would and prints ``ok CASE`` when all held.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
import sysconfig
import warnings
from importlib import metadata
from pathlib import Path

SITE = Path(sysconfig.get_paths()["purelib"]).resolve()
BIN = Path(sys.executable).parent


def installed(*modules: str) -> None:
    """Each module, and each distribution with an entry point of the group ``diffract``,
    lies in this environment's site-packages."""
    for name in modules:
        where = Path(importlib.import_module(name).__file__).resolve()
        assert where.is_relative_to(SITE), f"{name} imported from {where}, not from {SITE}"
    for ep in metadata.entry_points(group="diffract"):
        where = Path(ep.dist.locate_file("")).resolve()
        assert where == SITE, f"entry point {ep.name} of {ep.dist.name} is read from {where}"
        module = importlib.util.find_spec(ep.module.split(".")[0])
        assert Path(module.origin).resolve().is_relative_to(SITE), (ep.name, module.origin)


def absent(*modules: str) -> None:
    for name in modules:
        assert importlib.util.find_spec(name) is None, f"{name} is installed here"


def command(*args: str, code: int = 0) -> str:
    """``diffract ARGS``, as the installed console script; its stdout and stderr."""
    run = subprocess.run([str(BIN / "diffract"), *args], capture_output=True, text=True,
                         timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == code, f"diffract {' '.join(args)}: exit {run.returncode}\n{out}"
    return out


def matrices() -> dict:
    import numpy as np

    rng = np.random.default_rng(7)
    return {"layer.0.weight": rng.standard_t(3, (256, 128)),  # heavy-tailed: alpha fits
            "layer.1.weight": rng.standard_normal((16, 48)) * np.arange(1, 49) / 48,
            "layer.1.bias": rng.standard_normal(16)}


def stable_rank(w) -> float:
    import numpy as np

    s = np.linalg.svd(w, compute_uv=False)
    return float((s**2).sum() / s[0] ** 2)


def write_safetensors(path: Path, tensors: dict) -> None:
    """A safetensors file written from the format's definition (no library here)."""
    import numpy as np

    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def case_core(version: str) -> None:
    """(a) diffractml-core alone, no torch: a session on numpy arrays with the user's
    kernel, the core's commands, and what to install for what is missing."""
    installed("diffract", "_diffract_launch", "_diffract_shared", "numpy", "pluggy")
    absent("torch", "diffract_formats", "diffract_report", "diffract_kernels_spectral")
    import numpy as np

    import diffract
    from diffract import Session
    from diffract.errors import DiffractError

    assert diffract.__version__ == version, diffract.__version__
    weights = matrices()
    with Session() as session:
        @session.compute.kernel()
        def max_abs(weights: np.ndarray) -> float:
            return float(np.abs(weights).max())

        session.models.add(weights, model_id="m")
        session.compute.apply("max_abs", "frob_norm")
        got = session.results.export_metrics("max_abs", "frob_norm")["m"]
        for name, w in weights.items():
            assert got[name]["max_abs"] == float(np.abs(w).max()), name
            assert abs(got[name]["frob_norm"] - np.linalg.norm(w)) <= 1e-12 * np.linalg.norm(w)
        path = Path("m.safetensors")
        write_safetensors(path, weights)
        try:
            session.models.add(str(path), model_id="file")
        except DiffractError as exc:
            assert "pip install diffractml-formats" in str(exc), exc
        else:
            raise AssertionError("a safetensors file was read without diffractml-formats")
    assert "plugins" in command("--help") and "kernels" in command("--help")
    listed = command("--version").split()
    assert listed == ["diffract", version, "diffractml-core", version], listed
    assert "diffractml-core " + version + ": loaded" in command("plugins")
    missing = command("analyze", str(path), code=2)
    assert "pip install diffractml-report" in missing, missing


def case_spectral(version: str) -> None:
    """(b) the core and the spectral pack: its kernels on numpy arrays, and the pack
    among the plugins."""
    installed("diffract", "diffract_kernels_spectral", "scipy", "powerlaw")
    absent("torch", "diffract_formats", "diffract_report")
    from diffract import Session

    weights = matrices()
    with Session() as session:
        session.models.add(weights, model_id="m")
        with warnings.catch_warnings(record=True):  # layer 1's alpha is undefined
            session.compute.apply("stable_rank", "pl_alpha")
        got = session.results.export_metrics("stable_rank", "pl_alpha")["m"]
        notes = session.results.export_notes()
    for name in ("layer.0.weight", "layer.1.weight"):
        want = stable_rank(weights[name])
        assert abs(got[name]["stable_rank"] - want) <= 1e-9 * want, (name, got[name], want)
    assert 2 < got["layer.0.weight"]["pl_alpha"] < 4.5, got  # Student's t, 3 degrees
    assert got["layer.1.weight"]["pl_alpha"] != got["layer.1.weight"]["pl_alpha"]  # NaN
    assert any(n["unit"] == "m/layer.1.weight" and "min_tail" in n["reason"] for n in notes)
    out = command("plugins")
    assert re.search(rf"^diffractml-kernels-spectral {re.escape(version)} .*: loaded$", out,
                     re.M), out


def case_report(version: str) -> None:
    """(c) core, spectral pack, report and formats: ``diffract analyze`` of a safetensors
    file (its values), the HTML report with its JavaScript inside, and the message that
    names a format's missing extra."""
    installed("diffract", "diffract_kernels_spectral", "diffract_report", "diffract_formats")
    absent("torch", "gguf", "h5py")
    import csv

    weights = matrices()
    write_safetensors(Path("m.safetensors"), weights)
    command("analyze", "m.safetensors", "--metrics", "stable_rank", "--format", "csv",
            "--out", "table", "--report", "report.html")
    with open("table/metrics.csv") as f:
        rows = {r["param"]: r for r in csv.DictReader(f)}
    for name in ("layer.0.weight", "layer.1.weight"):
        want = stable_rank(weights[name].astype("float32"))
        got = float(rows[name]["stable_rank"])
        assert abs(got - want) <= 1e-5 * want, (name, got, want)
    html = Path("report.html").read_text()
    charts = (SITE / "diffract_report" / "_charts.js").read_text()
    assert charts.strip() and charts.strip()[:200] in html, "the report lacks its charts' code"
    Path("m.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    out = command("analyze", "m.gguf", code=2)
    assert "diffractml-formats[gguf]" in out, out


def case_training(version: str) -> None:
    """(d) the training plugin with torch: a Monitor on a tiny model, its values those of
    the weights it saw."""
    installed("diffract", "diffract_training", "diffract_kernels_spectral", "torch")
    import torch

    from diffract_training import Monitor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Monitor(model, every=2, metrics=("stable_rank",), background=False) as monitor:
        for step in range(1, 5):
            model(torch.randn(16, 24)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            monitor.step(step)
    latest = monitor.latest("stable_rank")
    assert monitor.analysed == [2, 4], monitor.analysed
    for name in ("0.weight", "2.weight"):
        step, value = latest[name]
        want = stable_rank(model.get_parameter(name).detach().double().numpy())
        assert step == 4 and abs(value - want) <= 1e-5 * want, (name, value, want)


def case_kernel_fun(version: str) -> None:
    """(e) diffractml-kernel-fun-gpu with fla-core on a CPU (Triton's interpreter): a
    call outside the drop-in's box (a bias) goes to fla, and its answer is fla's own,
    bit for bit; one inside it is the drop-in's, equal to the reference definition."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    installed("kernel_fun", "fla", "torch", "triton")
    import torch
    from triton.runtime.autotuner import Autotuner

    import kernel_fun
    from kernel_fun.adopt import original
    from kernel_fun.cconv import causal_conv1d, is_supported, reference_causal_conv1d

    # the interpreter cannot time fla's autotuned configurations: the first one runs
    Autotuner.do_bench = property(lambda self: lambda fn, quantiles=None, **kw: [1.0] * 3)
    assert kernel_fun.__version__ == version
    torch.manual_seed(0)
    x, weight, bias = torch.randn(2, 19, 16), torch.randn(16, 4), torch.randn(16)
    supported, why = is_supported(x, weight, bias=bias, activation="silu")
    assert not supported and "bias" in why, why
    ours = causal_conv1d(x, weight, bias=bias, activation="silu")
    theirs = original("causal_conv1d")(x, weight, bias=bias, activation="silu")
    assert torch.equal(ours[0], theirs[0])
    assert is_supported(x, weight, activation="silu")[0]
    engaged = causal_conv1d(x, weight, activation="silu")[0]
    want = reference_causal_conv1d(x, weight)  # silu(causal depthwise conv), float32
    assert torch.allclose(engaged, want, rtol=1e-5, atol=1e-5), (engaged - want).abs().max()


def case_pack(version: str) -> None:
    """A third-party pack built outside this repository and installed into (b): listed
    by ``diffract plugins``, its kernels computing what their docstrings say."""
    installed("diffract", "diffract_example_pack", "diffract_kernels_spectral")
    import numpy as np

    from diffract import Session

    out = command("plugins")
    assert re.search(r"^diffractml-example-pack 0\.1\.0 .*: loaded$", out, re.M), out
    assert "row_norm_stats" in out and "max_row_norm" in out, out
    weights = matrices()
    with Session() as session:
        session.models.add(weights, model_id="m")
        session.compute.apply("row_norm_mean", "row_norm_std", "max_row_norm")
        got = session.results.export_metrics("row_norm_mean", "row_norm_std")["m"]
        top = session.results.export_aggregates("max_row_norm")
    means = []
    for name in ("layer.0.weight", "layer.1.weight"):
        rows = np.linalg.norm(weights[name], axis=1)
        means.append(rows.mean())
        assert abs(got[name]["row_norm_mean"] - rows.mean()) <= 1e-12 * rows.mean()
        assert abs(got[name]["row_norm_std"] - rows.std()) <= 1e-12 * rows.std()
    assert abs(top["max_row_norm@models[m]"] - max(means)) <= 1e-12 * max(means), top


def case_clash(version: str) -> None:
    """A second pack registering a kernel of the same name: neither is used, and both
    ``diffract plugins`` and an apply say which distributions clash and what to do."""
    from diffract import Session
    from diffract.errors import DiffractError

    out = command("plugins")
    assert ("Conflicting plugins: kernel or field 'row_norm_stats' is provided by "
            "clash-pack 0.1.0 and diffractml-example-pack 0.1.0; neither is used") in out, out
    assert "uninstall one" in out, out
    with Session() as session:
        session.models.add(matrices(), model_id="m")
        try:
            session.compute.apply("row_norm_stats")
        except DiffractError as exc:
            text = str(exc)
            assert "diffractml-example-pack" in text and "clash-pack" in text, text
        else:
            raise AssertionError("a contested kernel ran")


if __name__ == "__main__":
    case, version = sys.argv[1], sys.argv[2]
    globals()[f"case_{case}"](version)
    print(f"ok {case}")
