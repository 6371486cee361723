"""Models computed from others: fine-tuning deltas (base_model_id=) and LoRA updates
(models.add_lora), in memory and in the durable profile."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from diffract import Session
from diffract.errors import (
    EmptyModelError,
    ModelSourceError,
    ModelWarning,
    UnknownModelError,
)


@pytest.fixture
def pair(rng):
    base = {"a.weight": rng.standard_normal((20, 12)).astype(np.float32),
            "b.weight": rng.standard_normal((8, 8)),
            "b.bias": rng.standard_normal(8)}
    tuned = {k: v + 0.01 * rng.standard_normal(v.shape).astype(v.dtype) for k, v in base.items()}
    tuned["head.weight"] = rng.standard_normal((3, 12))  # new in fine-tuning
    tuned["b.weight"] = tuned["b.weight"][:, :6]  # reshaped: no delta
    return base, tuned


class TestDeltas:
    def test_weights_are_the_difference(self, pair):
        base, tuned = pair
        with Session() as s:
            s.models.add(base, model_id="base")
            with pytest.warns(ModelWarning, match=r"2 parameter\(s\) of 'ft'.*'b.weight'"):
                names = s.models.add(tuned, model_id="ft", base_model_id="base")
            assert names == ["a.weight", "b.bias"]
            s.compute.apply("frob_norm")
            got = s.results.export_metrics("frob_norm")["ft"]
            for name in names:
                diff = tuned[name].astype(np.float64) - base[name]
                assert got[name]["frob_norm"] == pytest.approx(np.linalg.norm(diff), rel=1e-6)
            rows = s.results.export_metrics("frob_norm", export_format="pandas")
            assert set(rows[rows.model_id == "ft"]["meta.delta_of"]) == {"base"}

    def test_a_torch_base_and_tuned_module(self, rng):
        torch = pytest.importorskip("torch")
        base = torch.nn.Linear(10, 6)
        tuned = torch.nn.Linear(10, 6)
        with Session() as s:
            s.models.add(base, model_id="base")
            s.models.add(tuned, model_id="ft", base_model_id="base")
            s.compute.apply("svals")
            svals = s.results.export_metrics("svals", include_arrays=True)["ft"]["weight"]["svals"]
        expected = np.linalg.svd((tuned.weight - base.weight).detach().double().numpy(),
                                 compute_uv=False)
        np.testing.assert_allclose(svals, expected, rtol=1e-6)

    def test_it_survives_a_reopen(self, pair, tmp_path):
        base, tuned = pair
        del tuned["head.weight"], tuned["b.weight"]
        with Session(profile="local", path=tmp_path / "s") as s:
            s.models.add(base, model_id="base")
            s.models.add(tuned, model_id="ft", base_model_id="base")
        with Session(profile="local", path=tmp_path / "s") as s:
            s.compute.apply("frob_norm")
            got = s.results.export_metrics("frob_norm")["ft"]["a.weight"]["frob_norm"]
        assert got == pytest.approx(float(np.linalg.norm(
            tuned["a.weight"].astype(np.float64) - base["a.weight"])), rel=1e-6)

    def test_bad_bases(self, pair, rng):
        base, tuned = pair
        with Session() as s:
            with pytest.raises(UnknownModelError):
                s.models.add(tuned, model_id="ft", base_model_id="nope")
            s.models.add({"x": rng.standard_normal((4, 4))}, model_id="other")
            with pytest.raises(EmptyModelError, match="shares no parameter"):
                s.models.add(tuned, model_id="ft", base_model_id="other")
            assert s.models.model_ids == ["other"]  # nothing half-added


def _adapter(rng, r=4):
    return {
        "base_model.model.q.lora_A.weight": rng.standard_normal((r, 16)).astype(np.float32),
        "base_model.model.q.lora_B.weight": rng.standard_normal((24, r)).astype(np.float32),
        "base_model.model.conv.lora_A.weight": rng.standard_normal((r, 3, 3, 3)),
        "base_model.model.conv.lora_B.weight": rng.standard_normal((5, r, 1, 1)),
    }


class TestLora:
    def test_updates_from_a_state_dict(self, rng):
        sd = _adapter(rng)
        with Session() as s:
            names = s.models.add_lora(sd, "lora", scale=0.5)
            assert names == ["conv.weight", "q.weight"]
            s.compute.apply("svals", "frob_norm")
            rows = s.results.export_metrics(include_arrays=True)["lora"]
            params = {p.name: p for p in s.store.params("lora")}
        q = 0.5 * sd["base_model.model.q.lora_B.weight"].astype(np.float64) @ sd[
            "base_model.model.q.lora_A.weight"]
        assert rows["q.weight"]["frob_norm"] == pytest.approx(np.linalg.norm(q), rel=1e-6)
        s_q = rows["q.weight"]["svals"]
        assert np.count_nonzero(s_q > 1e-6 * s_q[0]) == 4  # rank r
        conv = 0.5 * (sd["base_model.model.conv.lora_B.weight"].reshape(5, 4)
                      @ sd["base_model.model.conv.lora_A.weight"].reshape(4, 27))
        np.testing.assert_allclose(rows["conv.weight"]["svals"],
                                   np.linalg.svd(conv, compute_uv=False), rtol=1e-9)
        assert params["conv.weight"].shape == (5, 3, 3, 3)
        assert params["q.weight"].meta_dict == {"lora_rank": 4, "lora_scale": 0.5}

    def test_a_peft_directory_gives_the_scale(self, rng, tmp_path):
        torch = pytest.importorskip("torch")
        st = pytest.importorskip("safetensors.torch")
        sd = _adapter(rng, r=8)
        st.save_file({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
                      for k, v in sd.items()}, str(tmp_path / "adapter_model.safetensors"))
        (tmp_path / "adapter_config.json").write_text(json.dumps({"lora_alpha": 16, "r": 8}))
        with Session() as s:
            s.models.add_lora(tmp_path, "plain")
            (tmp_path / "adapter_config.json").write_text(
                json.dumps({"lora_alpha": 16, "r": 8, "use_rslora": True}))
            s.models.add_lora(tmp_path, "rs")
            scales = {m: s.store.params(m)[0].meta_dict["lora_scale"] for m in ("plain", "rs")}
        assert scales == {"plain": 2.0, "rs": pytest.approx(16 / math.sqrt(8))}

    def test_what_is_not_an_adapter(self, rng, tmp_path):
        with Session() as s:
            with pytest.raises(EmptyModelError, match="no LoRA pairs"):
                s.models.add_lora({"w": rng.standard_normal((4, 4))}, "x")
            sd = _adapter(rng)
            del sd["base_model.model.q.lora_B.weight"]
            with pytest.raises(ModelSourceError, match=r"\['q'\] lack their A or B"):
                s.models.add_lora(sd, "x")
            with pytest.raises(ModelSourceError, match="holds no adapter_model"):
                s.models.add_lora(tmp_path, "x")
            assert s.models.model_ids == []
