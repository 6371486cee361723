"""models.add: torch modules, state dicts, checkpoint files; results export formats."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from diffract import Session
from diffract.errors import ModelSourceError


class TestSources:
    def test_torch_module_parameters_and_dtypes(self, session):
        """A module's parameters are recorded; bf16 weights arrive as float32 arrays."""
        model = torch.nn.Linear(4, 3).to(torch.bfloat16)
        names = session.models.add(model, model_id="m")
        assert names == ["weight", "bias"] and isinstance(names, list)
        assert repr(names) == "<2 parameters: weight, bias>"  # a notebook shows one line
        infos = {p.name: p for p in session.models.params("m")}
        assert infos["weight"].shape == (3, 4) and infos["weight"].dtype == "bfloat16"
        session.compute.apply("frob_norm")
        expected = np.linalg.norm(model.weight.detach().float().numpy().astype(np.float64))
        assert session.results.export_metrics("frob_norm")["m"]["weight"]["frob_norm"] == pytest.approx(expected)

    def test_state_dict_skips_integer_buffers(self, session):
        """Integer buffers (num_batches_tracked) are not weights."""
        bn = torch.nn.BatchNorm1d(4)
        names = session.models.add(bn.state_dict(), model_id="bn")
        assert "num_batches_tracked" not in names and "running_mean" in names

    def test_checkpoint_file_loads_with_weights_only(self, session, tmp_path):
        """A .pt state dict loads with weights_only; a pickled object is refused, nothing runs."""
        path = tmp_path / "ckpt.pt"
        torch.save({"w": torch.ones(2, 3)}, path)
        session.models.add(path, model_id="file")
        session.compute.apply("numel")
        assert session.results.export_metrics()["file"]["w"]["numel"] == 6

        class Evil:
            def __reduce__(self):
                return (print, ("pwned",))

        evil = tmp_path / "evil.pt"
        torch.save({"w": Evil()}, evil)
        with pytest.raises(ModelSourceError, match=r"weights_only=True.*never unpickles arbitrary objects"):
            session.models.add(evil, model_id="evil")

    def test_npz_and_unsupported_sources(self, session, tmp_path):
        """npz archives load; an unknown object or suffix gets a hint."""
        np.savez(tmp_path / "m.npz", a=np.ones((2, 2)), i=np.arange(3))
        assert session.models.add(tmp_path / "m.npz", model_id="npz") == ["a"]
        with pytest.raises(ModelSourceError, match="cannot read a builtins.int"):
            session.models.add(3, model_id="x")
        with pytest.raises(ModelSourceError, match=r"unsupported file type '\.txt'"):
            (tmp_path / "m.txt").write_text("")
            session.models.add(tmp_path / "m.txt", model_id="y")
        with pytest.raises(ModelSourceError, match=r"training checkpoint: pass its state dict, e.g. checkpoint\['model'\]"):
            session.models.add({"model": {"w": torch.ones(1)}, "epoch": 3}, model_id="z")


class TestExport:
    def test_pandas_json_csv(self, session, arrays, tmp_path):
        """Every export format carries the same values."""
        session.models.add(arrays, model_id="m")
        session.compute.apply("frob_norm", "param_norm")
        frame = session.results.export_metrics("frob_norm", export_format="pandas")
        assert list(frame.columns) == ["model_id", "param", "ptype", "frob_norm"] and len(frame) == 4
        row = frame.set_index("param").loc["conv.weight", "frob_norm"]
        assert row == pytest.approx(np.linalg.norm(arrays["conv.weight"]))
        data = json.loads(session.results.export_metrics("frob_norm", export_format="json"))
        assert {d["param"]: d["frob_norm"] for d in data}["conv.weight"] == pytest.approx(row)
        out = session.results.export_aggregates("param_norm", export_format="csv", path=tmp_path / "a.csv")
        assert out.read_text().splitlines()[1].startswith("param_norm@models[m],param_norm,m,,")
        agg = session.results.export_aggregates(export_format="pandas")
        assert agg.loc[0, "value"] == pytest.approx(sum(np.sum(a**2) for a in arrays.values()))

    def test_filter_scopes_results(self, session, arrays):
        """A view exports only its models; unknown ids are refused."""
        session.models.add(arrays, model_id="a")
        session.models.add(arrays, model_id="b")
        view = session.filter(model_ids=["b"])
        view.compute.apply("param_norm")
        assert list(session.results.export_aggregates()) == ["param_norm@models[b]"]
        assert list(view.results.export_metrics()) == ["b"]
        from diffract.errors import UnknownModelError

        with pytest.raises(UnknownModelError, match=r"Unknown model id\(s\) \['c'\]"):
            session.filter(model_ids=["c"])


def test_import_is_lazy():
    """import diffract imports neither torch nor a plugin; adding a torch model imports torch."""
    code = (
        "import sys, diffract\n"
        "before = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffract_example_pack', 'pluggy'))\n"
        "from diffract import Session\n"
        "s = Session()\n"
        "mid = 'torch' in sys.modules\n"
        "s.models.add('ckpt.npz' if False else {'w': __import__('numpy').ones((2, 2))}, model_id='m')\n"
        "print(before, mid, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] False False"
    code2 = "import sys, diffract\nimport torch\ns = diffract.Session()\ns.models.add(torch.nn.Linear(2, 2), model_id='m')\nprint('ok')"
    assert subprocess.run([sys.executable, "-c", code2], capture_output=True, text=True, check=True).stdout.strip() == "ok"


class TestTensorField:
    def test_tensor_is_the_sources_own_object(self, session, arrays):
        """`tensor` gives torch parameters as they are (same storage, dtype, device) and
        numpy arrays as arrays; `weights` is always numpy."""
        model = torch.nn.Linear(4, 3).to(torch.bfloat16)
        seen = {}

        @session.compute.kernel()
        def t_kind(tensor, weights):
            seen[tensor.shape] = (tensor, weights)
            return 1

        session.models.add(model, model_id="torch")
        session.models.add({"a": arrays["layer0.weight"]}, model_id="numpy")
        session.compute.apply("t_kind")
        tensor, weights = seen[torch.Size([3, 4])]
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.bfloat16
        assert tensor.data_ptr() == model.weight.data_ptr()
        assert isinstance(weights, np.ndarray) and weights.dtype == np.float32
        array, _ = seen[(16, 8)]
        assert isinstance(array, np.ndarray)


def test_every_filter_form_on_names_where_the_forms_disagree():
    """Exact, glob (whole name), re: (searched anywhere) and a view's label, on names
    built so the forms give different answers (h.1 against h.10 and xh.1, dots that a
    regex reads as any character, a label's brackets that a glob reads as a class);
    random patterns and groups, against a reference written out here; a filtered view
    of a view keeps what both keep (issue 36, filters)."""
    import re

    rng = np.random.default_rng(12)
    names = [f"{pre}h.{i}.{leaf}.weight" for pre in ("", "x") for i in (1, 10, 2)
             for leaf in ("attn", "mlp")] + ["h.1.attn.weight[head=1]",
                                             "h.1.attn.weight[head=2]", "hX1.attn.weight"]
    patterns = ["h.1.attn.weight", "h.1.*", "*h.1.*", "h.1?.*", "h.[12].*", "*[head=1]",
                "*[head=*]", "h.1.attn.weight[head=2]", "re:h.1", r"re:^h\.1\.",
                r"re:\[head=\d\]$", "re:mlp", "re:^x", "*.mlp.weight", "h.?.attn.weight"]

    def reference(pattern: str, name: str) -> bool:
        if pattern.startswith("re:"):
            return re.search(pattern[3:], name) is not None
        if any(c in pattern for c in "*?["):  # a glob, translated by hand: a bracketed
            def wild(text: str) -> str:        # group with "=" is a label (brackets
                return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c)
                               for c in text)  # literal, wildcards inside still wild)
            out, i = "", 0
            while i < len(pattern):
                if pattern[i] == "[":
                    j = pattern.index("]", i)
                    group = pattern[i + 1:j]
                    out += r"\[" + wild(group) + r"\]" if "=" in group else f"[{group}]"
                    i = j + 1
                else:
                    out += wild(pattern[i])
                    i += 1
            return name == pattern or re.fullmatch(out, name, re.S) is not None
        return name == pattern

    with Session() as s:
        s.models.add({n: np.ones((2, 2)) for n in names}, "m")
        for pattern in patterns:
            view = s.filter(param_names=pattern)
            got = {p.name for p in view.scope.params(s.store, "m")}
            assert got == {n for n in names if reference(pattern, n)}, pattern
        for _ in range(30):  # groups: any of a group; a view of a view: both
            first = list(rng.choice(patterns, size=int(rng.integers(1, 4)), replace=False))
            second = list(rng.choice(patterns, size=int(rng.integers(1, 3)), replace=False))
            view = s.filter(param_names=first).filter(param_names=second)
            got = {p.name for p in view.scope.params(s.store, "m")}
            assert got == {n for n in names if any(reference(p, n) for p in first)
                           and any(reference(p, n) for p in second)}, (first, second)
