"""Session API parity with the original Diffract: filters, parameter types and
overrides, model management, export formats, ingest and merge (on ram and local)."""

from __future__ import annotations

import numpy as np
import pytest

from diffract import ParameterOverrides, ParameterType, Session
from diffract.errors import (
    DuplicateModelError,
    InvalidArgumentError,
    MergeConflictError,
    ModelSourceError,
    UnknownFieldError,
    UnknownFormatError,
    UnknownModelError,
)
from diffract.plugins import split_contextual
from diffract.results import register_formatter

torch = pytest.importorskip("torch")


@pytest.fixture(params=["ram", "local"])
def new_session(request, tmp_path):
    """Makes sessions of the parametrized profile (local: one store per call)."""
    counter = iter(range(100))

    def make(**kwargs):
        if request.param == "ram":
            return Session(**kwargs)
        pytest.importorskip("diffract_storage_local")
        return Session(profile="local", path=tmp_path / f"st{next(counter)}", **kwargs)
    return make


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.attention = torch.nn.ModuleDict({"q_proj": torch.nn.Linear(8, 8),
                                              "k_proj": torch.nn.Linear(8, 8)})
        self.mlp = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.conv = torch.nn.Conv1d(4, 6, 3)


def _block():
    torch.manual_seed(0)
    return Block()


class TestParameterTypes:
    def test_types_come_from_modules_names_and_shapes(self, new_session):
        """nn modules give embedding/attention/dense/norm/conv/bias; a state dict the same
        from names and shapes."""
        with new_session() as s:
            s.models.add(_block(), model_id="m")
            s.models.add({k: v for k, v in _block().state_dict().items()}, model_id="sd")
            types = {p.name: p.ptype for p in s.models.params("m")}
            from_names = {p.name: p.ptype for p in s.models.params("sd")}
        assert types == {
            "embed.weight": "embedding", "attention.q_proj.weight": "attention",
            "attention.q_proj.bias": "bias", "attention.k_proj.weight": "attention",
            "attention.k_proj.bias": "bias", "mlp.weight": "dense", "mlp.bias": "bias",
            "norm.weight": "norm", "norm.bias": "bias", "conv.weight": "conv", "conv.bias": "bias",
        }
        assert from_names == types
        assert ParameterType.DENSE == "dense"

    def test_gpt2s_conv1d_is_a_linear_map_as_in_its_saved_file(self):
        """transformers' Conv1D (GPT-2's attention and MLP) holds a 2-D weight: a linear
        map, typed attention or dense from its name as the same weights in a state dict
        are, not conv (a 3-D nn.Conv1d weight stays conv)."""
        transformers = pytest.importorskip("transformers")
        torch.manual_seed(0)
        model = transformers.GPT2Model(transformers.GPT2Config(
            n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=8))
        with Session() as s:
            s.models.add(model, model_id="m")
            s.models.add(dict(model.state_dict()), model_id="sd")
            types = {p.name: p.ptype for p in s.models.params("m")}
            from_names = {p.name: p.ptype for p in s.models.params("sd")}
        assert {n: t for n, t in types.items() if n.startswith("h.0.") and "ln" not in n} == {
            "h.0.attn.c_attn.weight": "attention", "h.0.attn.c_attn.bias": "bias",
            "h.0.attn.c_proj.weight": "attention", "h.0.attn.c_proj.bias": "bias",
            "h.0.mlp.c_fc.weight": "dense", "h.0.mlp.c_fc.bias": "bias",
            "h.0.mlp.c_proj.weight": "dense", "h.0.mlp.c_proj.bias": "bias"}
        assert types == from_names

    def test_packed_experts_are_dense_whatever_their_naming(self):
        """3-D expert tensors (transformers' experts.gate_up_proj, llama.cpp's
        ffn_gate_exps) are linear maps; a 3-D tensor otherwise is a convolution."""
        rng = np.random.default_rng(0)
        state = {"model.layers.0.mlp.experts.gate_up_proj": rng.standard_normal((4, 8, 6)),
                 "blk.0.ffn_gate_exps.weight": rng.standard_normal((4, 8, 6)),
                 "encoder.conv.weight": rng.standard_normal((4, 8, 3))}
        with Session() as s:
            s.models.add(state, model_id="m")
            types = {p.name: p.ptype for p in s.models.params("m")}
        assert types == {"model.layers.0.mlp.experts.gate_up_proj": "dense",
                         "blk.0.ffn_gate_exps.weight": "dense", "encoder.conv.weight": "conv"}

    def test_overrides_rename_retype_and_attach_metadata(self, new_session):
        """A renamed parameter is computed and exported under its new name (its weights
        still read from the original), with its type and metadata; also after a reopen."""
        overrides = {"mlp.weight": ParameterOverrides(name="ffn.up", ptype="mlp-up",
                                                      other_meta={"layer": 3})}
        block = _block()
        with new_session() as s:
            s.models.add(block, model_id="m", parameter_overrides=overrides)
            s.compute.apply("frob_norm")
            frame = s.results.export_metrics("frob_norm", export_format="pandas")
            row = frame.set_index("param").loc["ffn.up"]
        assert row["ptype"] == "mlp-up" and row["meta.layer"] == 3
        assert row["frob_norm"] == pytest.approx(float(block.mlp.weight.norm()), rel=1e-6)
        with pytest.raises(ModelSourceError, match=r"parameter_overrides name parameter\(s\) "
                           r"the model does not have: \['nope'\]"):
            with new_session() as s:
                s.models.add(block, model_id="m", parameter_overrides={"nope": ParameterOverrides()})

    def test_a_renamed_file_parameter_reads_after_a_reopen(self, tmp_path):
        """Renames are part of the source record: a reopened store reads the file under
        the original name."""
        pytest.importorskip("diffract_storage_local")
        path = tmp_path / "m.npz"
        np.savez(path, w=np.full((2, 2), 3.0))
        with Session(profile="local", path=tmp_path / "st") as s:
            s.models.add(path, model_id="m", parameter_overrides={"w": ParameterOverrides(name="renamed")})
        with Session(profile="local", path=tmp_path / "st") as s:
            s.compute.apply("frob_norm")
            assert s.results.export_metrics("frob_norm")["m"] == {"renamed": {"frob_norm": 6.0}}


class TestFilters:
    def test_names_types_ids_and_chaining(self, new_session):
        """Globs, regular expressions, types and ids select parameters; chained filters
        narrow; compute and results act on the view only; views are context managers."""
        with new_session() as s:
            s.models.add(_block(), model_id="a")
            s.models.add(_block(), model_id="b")
            with s.filter(param_names=["attention.*"]) as view:
                view.compute.apply("frob_norm")
                assert sorted(view.results.export_metrics()["a"]) == [
                    "attention.k_proj.bias", "attention.k_proj.weight",
                    "attention.q_proj.bias", "attention.q_proj.weight"]
            assert sorted(s.results.export_metrics()["b"]) == sorted(s.results.export_metrics()["a"])
            dense = s.filter(param_types=[ParameterType.ATTENTION, "dense"])
            narrowed = dense.filter(param_names="re:^attention\\.q")
            assert sorted(narrowed.results.export_metrics()["a"]) == ["attention.q_proj.weight"]
            one = s.filter(model_ids=["b"], param_ids=["b/attention.k_proj.bias"])
            assert list(one.results.export_metrics()) == ["b"]
            assert list(one.results.export_metrics()["b"]) == ["attention.k_proj.bias"]
            erased = s.filter(param_names=["*.bias"]).results.erase("frob_norm")
            assert erased == 4 and "attention.q_proj.bias" not in s.results.export_metrics()["a"]
            with pytest.raises(InvalidArgumentError, match=r"Kernel\(s\) \['param_norm'\] "
                               r"summarise whole models"):
                s.filter(param_types="dense").compute.apply("param_norm")
            with pytest.raises(UnknownModelError, match=r"outside this view's scope"):
                s.filter(model_ids=["a"]).filter(model_ids=["b"])


class TestModels:
    def test_list_rename_erase(self, new_session):
        """models.list describes each model; rename moves fields and the aggregates that
        name it; erase removes the model and every aggregate involving it."""
        with new_session() as s:
            s.models.add(_block(), model_id="a")
            s.models.add(_block(), model_id="b")
            s.compute.apply("frob_norm", "param_norm")
            s.filter(model_ids=["a", "b"]).compute.apply("sval_rel_change")
            listing = {r["model_id"]: r for r in s.models.list()}
            assert listing["a"]["params"] == 11 and "embedding" in listing["a"]["ptypes"]
            s.models.rename("a", "base")
            assert s.model_ids == ["base", "b"] == s.models.model_ids
            names = s.results.export_aggregates()
            assert "param_norm@models[base]" in names
            assert "sval_rel_change@models[base,b]@params[mlp.weight]" in names
            assert not any("a" in split_contextual(n)[1] for n in names)
            assert len(s.results.export_metrics("frob_norm")["base"]) == 11
            with pytest.raises(DuplicateModelError, match=r"Cannot rename 'b' to 'base': a model "
                               r"'base' is already in this session"):
                s.models.rename("b", "base")
            with pytest.raises(UnknownModelError, match=r"Unknown model id\(s\) \['a'\]"):
                s.models.rename("a", "x")
            s.models.erase("b")
            assert s.model_ids == ["base"]
            assert list(s.results.export_aggregates()) == ["param_norm@models[base]"]
            stored = sum(len(r) for r in s.results.export_metrics(include_arrays=True)["base"].values()) + 1
            assert s.results.erase(erase_all=True) == stored
            assert s.results.export_metrics() == {"base": {}} and s.results.export_aggregates() == {}
            for wrong in ((), ("base",)):  # neither or both: one of the two is asked for
                with pytest.raises(InvalidArgumentError, match="takes model ids or "
                                   "erase_all=True: one of the two"):
                    s.models.erase(*wrong, erase_all=bool(wrong))
            assert s.model_ids == ["base"]
            s.models.erase(erase_all=True)
            assert s.model_ids == []


class TestExports:
    def test_list_polars_custom_and_combined(self, new_session):
        """'list' rows, a registered formatter, one table of metrics and aggregates;
        polars with a clear message when it is missing."""
        register_formatter("t_count", lambda records, columns: (len(records), columns[:2]))
        with new_session() as s:
            s.models.add({"w": np.ones((2, 2)), "v": np.ones((3, 3))}, model_id="m")
            s.compute.apply("frob_norm", "param_norm")
            rows = s.results.export_metrics("frob_norm", export_format="list")
            assert {r["param"]: r["frob_norm"] for r in rows} == {"w": 2.0, "v": 3.0}
            assert s.results.export_metrics(export_format="t_count") == (2, ["model_id", "param"])
            table = s.results.export()
            kinds = sorted((r["kind"], r["field"], r["param"]) for r in table)
            assert kinds == [("aggregate", "param_norm", None), ("metric", "frob_norm", "v"),
                             ("metric", "frob_norm", "w")]
            agg = next(r for r in table if r["kind"] == "aggregate")
            assert agg["model_id"] == "m" and agg["value"] == 13.0
            with pytest.raises(UnknownFormatError, match=r"Unknown export_format 'xml'"):
                s.results.export_metrics(export_format="xml")
            try:
                import polars  # noqa: F401
            except ImportError:
                with pytest.raises(Exception, match=r"needs polars: pip install polars"):
                    s.results.export_metrics(export_format="polars")
            else:
                assert s.results.export_metrics(export_format="polars").shape[0] == 2
            assert s.compute.list_available_metrics()[:2] == sorted(s.compute.list_available_metrics())[:2]
            verbose = {r["field"]: r for r in s.compute.list_available_metrics(verbose=True)}
            assert verbose["pl_alpha"]["kernel"] == "power_law_fit"


class TestIngestAndMerge:
    def test_ingest_checks_everything_first(self, new_session):
        """Values from elsewhere are stored; unknown models or parameters, unstorable
        values and arrays of the wrong dimension are refused with nothing stored;
        existing values are kept unless overwrite."""
        with new_session() as s:
            s.models.add({"w": np.ones((2, 2)), "v": np.ones((3, 3))}, model_id="m")
            s.compute.apply("esd")
            assert s.results.ingest_metrics({"m": {"w": {"t_ext": 1.5}, "v": {"t_ext": 2}}}) == 2
            with pytest.raises(InvalidArgumentError, match=r"(?s)Nothing was ingested:.*m/v 'esd': "
                               r"a 2-D array, but the stored values of this field are 1-D.*"
                               r"m/x: no such parameter.*model 'nope' is not in scope"):
                s.results.ingest_metrics({"m": {"v": {"esd": np.ones((2, 2)), "t_b": "text"},
                                                "x": {"t_ext": 1.0}}, "nope": {}})
            with pytest.raises(InvalidArgumentError, match=r"m/w 't_ext': already stored \(pass "
                               r"force=True to overwrite\)"):
                s.results.ingest_metrics({"m/w": {"t_ext": 9.0}})  # the original's uid form
            assert s.results.ingest_metrics({"m/w": {"t_ext": 9.0}}, force=True) == 1
            assert s.results.export_metrics("t_ext")["m"]["w"]["t_ext"] == 9.0
            assert s.results.ingest_aggregates({"t_total@models[m]": 3.0}) == 1
            assert s.results.ingest_aggregates([{"field_name": "t_pair", "context_models": ["m"],
                                                 "context_params": ["w"], "value": 1.0}]) == 1
            assert "t_pair@models[m]@params[w]" in s.results.export_aggregates()
            with pytest.raises(InvalidArgumentError, match=r"names models outside the scope"):
                s.results.ingest_aggregates({"t_total@models[zz]": 3.0})
            with pytest.raises(UnknownFieldError):
                s.results.export_metrics("t_nothing")

    def test_merge_adds_models_and_values_and_reports_conflicts(self, new_session):
        """Merging copies what is missing; differing values are conflicts: raise (nothing
        changed), keep ours, or take theirs."""
        rng = np.random.default_rng(0)
        arrays = {"w": rng.standard_normal((4, 4)), "v": rng.standard_normal((3, 3))}
        with new_session() as mine, new_session() as theirs:
            mine.models.add(arrays, model_id="m")
            mine.compute.apply("frob_norm")
            theirs.models.add(arrays, model_id="m")
            theirs.models.add({"u": np.ones((2, 2))}, model_id="other")
            theirs.compute.apply("frob_norm", "param_norm")
            report = mine.merge(theirs)
            assert report["models_added"] == ["other"] and report["conflicts"] == []
            assert mine.results.export_metrics("frob_norm")["other"] == {"u": {"frob_norm": 2.0}}
            assert "param_norm@models[m]" in mine.results.export_aggregates()
            theirs.results.ingest_metrics({"m": {"w": {"frob_norm": -1.0}}}, force=True)
            with pytest.raises(MergeConflictError, match=r"1 conflict\(s\).*\n  m/w 'frob_norm': "
                               r"different values"):
                mine.merge(theirs)
            mine.merge(theirs, on_conflict="keep")
            assert mine.results.export_metrics("frob_norm")["m"]["w"]["frob_norm"] > 0
            mine.merge(theirs, on_conflict="theirs")
            assert mine.results.export_metrics("frob_norm")["m"]["w"]["frob_norm"] == -1.0
            third = Session()
            third.models.add({"w": np.ones((5, 5))}, model_id="m")
            with pytest.raises(MergeConflictError, match=r"model 'm': its parameters differ"):
                mine.merge(third)


@pytest.mark.parametrize("seed", range(6))
def test_every_merge_policy_on_fields_and_aggregates(seed):
    """Random sessions holding per-parameter values and aggregates, some only on one
    side, some equal on both, some different: "raise" refuses any difference and changes
    nothing, "keep" keeps ours where they differ, "theirs" takes theirs; everything
    only one side has arrives either way (issue 36, merge)."""
    from diffract.errors import MergeConflictError

    rng = np.random.default_rng(seed)
    params = [f"p{i}" for i in range(6)]
    arrays = {p: np.ones((2, 2)) for p in params}

    def side(values: dict, aggregates: dict) -> Session:
        s = Session()
        s.models.add(arrays, model_id="m")
        s.results.ingest_metrics({"m": {p: {"score": v} for p, v in values.items()}})
        s.results.ingest_aggregates({f"total@models[m]@params[{p}]": v
                                     for p, v in aggregates.items()})
        return s

    def draw() -> tuple[dict, dict, bool]:
        ours, theirs, differ = {}, {}, False
        for p in params:
            kind = rng.choice(["ours", "theirs", "same", "different", "none"])
            if kind in ("ours", "same", "different"):
                ours[p] = float(rng.normal())
            if kind == "theirs":
                theirs[p] = float(rng.normal())
            if kind == "same":
                theirs[p] = ours[p]
            if kind == "different":
                theirs[p] = ours[p] + 1.0
                differ = True
        return ours, theirs, differ

    (mv, tv, dv), (ma, ta, da) = draw(), draw()
    for policy in ("raise", "keep", "theirs"):
        mine, other = side(mv, ma), side(tv, ta)
        with mine, other:
            before = (mine.results.export_metrics("score"), mine.results.export_aggregates())
            if policy == "raise" and (dv or da):
                with pytest.raises(MergeConflictError):
                    mine.merge(other)
                assert (mine.results.export_metrics("score"),
                        mine.results.export_aggregates()) == before  # nothing changed
                continue
            mine.merge(other, on_conflict=policy)
            win = (lambda o, t: {**o, **t}) if policy == "theirs" else (
                lambda o, t: {**t, **o})
            got = mine.results.export_metrics("score").get("m", {})
            assert {p: row["score"] for p, row in got.items()} == win(mv, tv), policy
            got_aggregates = {name.split("[")[-1].rstrip("]"): v
                              for name, v in mine.results.export_aggregates().items()}
            assert got_aggregates == win(ma, ta), policy
