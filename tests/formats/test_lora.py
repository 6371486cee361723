"""diffractml-formats' ``peft-lora`` format: a LoRA adapter read as its updates
``scale * B @ A``, computed on read. An adapter directory is recognised by
``models.add`` and ``diffract analyze`` without naming the format; a durable store
records the adapter's files and reads them again instead of copying the dense updates
(an adapter of a 7B model's every linear layer is tens of MB; its updates tens of GB),
and refuses them when the config that gave the scale changed. A state dict in memory is
read by naming the format (``models.add(sd, id, format="peft-lora")``), the one way the
core lets a format read an object; other formats still refuse one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from diffract import Session  # noqa: E402
from diffract.errors import ApplyError, InvalidArgumentError, ModelSourceError  # noqa: E402

SIDE, RANK, ALPHA = 384, 4, 16
MODULES = ("layers.0.q", "layers.0.v", "layers.1.q", "layers.1.v")


def _adapter(rng) -> dict[str, np.ndarray]:
    sd = {}
    for module in MODULES:
        prefix = f"base_model.model.{module}"
        sd[f"{prefix}.lora_A.weight"] = rng.standard_normal((RANK, SIDE)).astype(np.float32)
        sd[f"{prefix}.lora_B.weight"] = rng.standard_normal((SIDE, RANK)).astype(np.float32)
    return sd


def _save(sd: dict[str, np.ndarray], folder: Path, alpha: float = ALPHA) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    st.save_file({k: torch.from_numpy(v) for k, v in sd.items()},
                 str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"lora_alpha": alpha, "r": RANK}))
    return folder


def _expected_norms(sd: dict[str, np.ndarray], scale: float) -> dict[str, float]:
    return {f"{m}.weight": float(np.linalg.norm(
        scale * (sd[f"base_model.model.{m}.lora_B.weight"].astype(np.float64)
                 @ sd[f"base_model.model.{m}.lora_A.weight"]))) for m in MODULES}


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_directory_is_recognised_and_read_as_its_updates(rng, tmp_path):
    sd = _adapter(rng)
    folder = _save(sd, tmp_path / "adapter")
    with Session() as s:
        names = s.models.add(folder, "lora")
        assert names == sorted(f"{m}.weight" for m in MODULES)
        s.compute.apply("frob_norm")
        got = s.results.export_metrics("frob_norm")["lora"]
        source = s.store.source("lora")
    for name, norm in _expected_norms(sd, ALPHA / RANK).items():
        assert got[name]["frob_norm"] == pytest.approx(norm, rel=1e-6)
    assert (source.format, source.kind) == ("peft-lora", "directory")
    assert [Path(f.path).name for f in source.files] == ["adapter_model.safetensors",
                                                        "adapter_config.json"]


def test_a_durable_store_reads_the_adapter_again_and_copies_no_update(rng, tmp_path):
    """The same adapter in memory is copied (the store is larger than its dense updates);
    from its directory only the adapter's files are recorded."""
    sd = _adapter(rng)
    folder = _save(sd, tmp_path / "adapter")
    dense = len(MODULES) * SIDE * SIDE * 4
    with Session(profile="local", path=tmp_path / "from-file") as s:
        s.models.add_lora(folder, "lora")
    with Session(profile="local", path=tmp_path / "in-memory") as s:
        s.models.add(sd, "lora", format="peft-lora", format_options={"scale": ALPHA / RANK})
    assert _bytes(tmp_path / "in-memory") > dense
    assert _bytes(tmp_path / "from-file") < dense / 4
    for store in ("from-file", "in-memory"):
        with Session(profile="local", path=tmp_path / store) as s:
            s.compute.apply("frob_norm")
            got = s.results.export_metrics("frob_norm")["lora"]
        for name, norm in _expected_norms(sd, ALPHA / RANK).items():
            assert got[name]["frob_norm"] == pytest.approx(norm, rel=1e-6), store


def test_a_reopened_store_refuses_an_adapter_whose_config_changed(rng, tmp_path):
    """The scale comes from adapter_config.json: another alpha there would give other
    updates under the same model, so the reopened store fails its parameters instead."""
    folder = _save(_adapter(rng), tmp_path / "adapter")
    with Session(profile="local", path=tmp_path / "s") as s:
        s.models.add_lora(folder, "lora")
    (folder / "adapter_config.json").write_text(json.dumps({"lora_alpha": 2 * ALPHA,
                                                            "r": RANK}))
    with Session(profile="local", path=tmp_path / "s") as s:
        with pytest.raises(ApplyError, match=r"adapter_config\.json' changed since the model "
                                             r"was added"):
            s.compute.apply("frob_norm")


def test_a_state_dict_with_its_scale_equals_the_directory(rng, tmp_path):
    sd = _adapter(rng)
    folder = _save(sd, tmp_path / "adapter")
    with Session() as s:
        s.models.add_lora(folder, "dir")
        s.models.add_lora({k: torch.from_numpy(v) for k, v in sd.items()}, "torch",
                          scale=ALPHA / RANK)
        s.models.add(sd, "numpy", format="peft-lora", format_options={"scale": ALPHA / RANK})
        s.compute.apply("svals")
        got = s.results.export_metrics("svals", include_arrays=True)
    for name in _expected_norms(sd, 1.0):
        np.testing.assert_array_equal(got["dir"][name]["svals"], got["torch"][name]["svals"])
        np.testing.assert_array_equal(got["dir"][name]["svals"], got["numpy"][name]["svals"])


def test_what_is_refused(rng, tmp_path):
    with Session() as s:
        with pytest.raises(InvalidArgumentError, match="format='npz' applies to checkpoint "
                                                       "files and directories, not to a dict"):
            s.models.add(_adapter(rng), "x", format="npz")
        with pytest.raises(ModelSourceError, match=r"Model 'x': entries \['a'\] are neither "
                                                   r"torch tensors"):
            s.models.add({"a": [1.0]}, "x", format="peft-lora")
        with pytest.raises(ModelSourceError, match="a PEFT adapter is read from its state "
                                                   "dict, its adapter_model file or its dir"):
            s.models.add(torch.nn.Linear(2, 2), "x", format="peft-lora")
        with pytest.raises(ModelSourceError, match="takes no option"):
            s.models.add(_adapter(rng), "x", format="peft-lora", format_options={"rank": 2})
        with pytest.raises(InvalidArgumentError, match=r"\['scale'\] applies to checkpoint"):
            s.models.add(_adapter(rng), "x", format_options={"scale": 2.0})
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "adapter_config.json").write_text('{"r": 4}')
        st.save_file({"base_model.model.q.lora_A.weight": torch.ones(4, 8),
                      "base_model.model.q.lora_B.weight": torch.ones(8, 4)},
                     str(tmp_path / "bad" / "adapter_model.safetensors"))
        with pytest.raises(ModelSourceError, match=r"no usable lora_alpha and r .*'lora_alpha'"):
            s.models.add(tmp_path / "bad", "x")
        for config in ('{"r": 0, "lora_alpha": 8}', '{"r": -4, "lora_alpha": 8, '
                                                      '"use_rslora": true}'):
            (tmp_path / "bad" / "adapter_config.json").write_text(config)
            with pytest.raises(ModelSourceError, match=r"no usable lora_alpha and r .*r must "
                                                       r"be positive"):
                s.models.add(tmp_path / "bad", "x")
        for config, why in (('{"r": 4, "lora_alpha": 1' + "0" * 400 + '}', "too large"),
                            ('{"r": 1' + "0" * 400 + ', "lora_alpha": 8}', "too large"),
                            ('{"r": 1e-300, "lora_alpha": 1e308}', "not a finite scale")):
            (tmp_path / "bad" / "adapter_config.json").write_text(config)
            with pytest.raises(ModelSourceError, match=rf"no usable lora_alpha and r "
                                                       rf"\(.*{why}.*adapter_config.json"):
                s.models.add(tmp_path / "bad", "x")
        for scale in ("2", float("nan")):
            with pytest.raises(ModelSourceError, match="scale must be a finite number"):
                s.models.add_lora(_adapter(rng), "x", scale=scale)
        assert s.models.model_ids == []


def test_the_command_line_analyses_an_adapter_directory(rng, tmp_path):
    sd = _adapter(rng)
    folder = _save(sd, tmp_path / "adapter")
    out = tmp_path / "rows.json"
    run = subprocess.run([sys.executable, "-m", "diffract.cli", "analyze", str(folder),
                          "--metrics", "frob_norm", "--format", "json", "--out", str(out), "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = json.loads((out / "metrics.json").read_text())
    got = {r["param"]: r["frob_norm"] for r in rows}
    expected = _expected_norms(sd, ALPHA / RANK)
    assert got.keys() == expected.keys()
    for name, norm in expected.items():
        assert got[name] == pytest.approx(norm, rel=1e-6)


def test_track_follows_the_adapters_of_a_peft_training_run(rng, tmp_path):
    """checkpoint-N/ folders holding only an adapter (what a PEFT Trainer saves) are a
    trajectory: each step's updates, read from its folder, in a store that copies none."""
    adapters = {}
    for step in (100, 200, 300):
        adapters[step] = _adapter(rng)
        folder = _save(adapters[step], tmp_path / "run" / f"checkpoint-{step}")
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    store = tmp_path / "store"
    run = subprocess.run([sys.executable, "-m", "diffract.cli", "track", str(tmp_path / "run"),
                          "--store", str(store), "--metrics", "frob_norm"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    # Copies of the three steps' dense updates would be 7 MiB; track keeps the top tenth
    # of the singular vectors for its alignment fields (docs/storage.md).
    assert _bytes(store) < 3 * len(MODULES) * SIDE * SIDE * 4 / 4
    with Session(profile="local", path=store) as s:
        steps = {m: r["step"] for m, r in s.models.steps().items()}
        got = s.results.export_metrics("frob_norm")
    assert sorted(steps.values()) == [100, 200, 300]
    for model_id, step in steps.items():
        for name, norm in _expected_norms(adapters[step], ALPHA / RANK).items():
            assert got[model_id][name]["frob_norm"] == pytest.approx(norm, rel=1e-6)


def test_an_adapter_folder_linking_outside_itself_is_refused(rng, tmp_path):
    """Nothing is read outside the adapter's folder: a weights file or a config that is a
    link out (a hostile download) is refused, naming the option that allows it."""
    elsewhere = _save(_adapter(rng), tmp_path / "elsewhere")
    for linked in ("adapter_model.safetensors", "adapter_config.json"):
        folder = _save(_adapter(rng), tmp_path / f"links-{linked}")
        (folder / linked).unlink()
        (folder / linked).symlink_to(elsewhere / linked)
        with Session() as s:
            with pytest.raises(ModelSourceError, match=rf"'{linked}' resolves to .*outside "
                                                       r"the checkpoint's folder"):
                s.models.add(folder, "x")
            s.models.add(folder, "x", format="peft-lora",
                         format_options={"allow_outside": True})
            assert s.models.model_ids == ["x"]


@pytest.mark.parametrize(("a_shape", "b_shape"), [((), (8, 4)), ((4,), (8, 4)), ((4, 8), (8,)),
                                                  ((4, 8), (8, 3))])
def test_pairs_that_do_not_multiply_are_refused(tmp_path, a_shape, b_shape):
    folder = tmp_path / "adapter"
    folder.mkdir()
    st.save_file({"base_model.model.q.lora_A.weight": torch.ones(a_shape),
                  "base_model.model.q.lora_B.weight": torch.ones(b_shape)},
                 str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"lora_alpha": 8, "r": 4}))
    with Session() as s, pytest.raises(ModelSourceError, match=r"q: lora_B .* does not "
                                                               r"multiply lora_A"):
        s.models.add(folder, "x")
