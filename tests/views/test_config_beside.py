"""The configuration beside a single checkpoint file is read for view rules (a
model.safetensors with its config.json was "head count unknown"), messages are worded
for the interface that prints them, and an empty rule list is refused (issue 32 item 3
and its bad input)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from diffract import Session
from diffract.cli import main
from diffract.errors import InvalidArgumentError, ModelSourceError

Q = "model.layers.0.self_attn.q_proj.weight"


def _single_file(folder, *, config: dict | None, kind: str = "safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    q = torch.randn(24, 24, generator=torch.Generator().manual_seed(0))
    if kind == "safetensors":
        path = folder / "model.safetensors"
        save_file({Q: q}, str(path))
    else:
        path = folder / "weights.npz"
        np.savez(path, **{Q: q.numpy()})
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return path, q.numpy()


class TestConfigBeside:
    @pytest.mark.parametrize("kind", ["safetensors", "npz"])
    def test_a_config_beside_a_single_file_gives_the_heads(self, tmp_path, kind):
        """model.safetensors (or .npz) + config.json: three heads of 8 rows, equal to numpy slices."""
        path, q = _single_file(tmp_path / "ck", config={"num_attention_heads": 3,
                                                        "hidden_size": 24}, kind=kind)
        with Session() as s:
            s.models.add(path, "m", views=["heads"])
            names = [p.name for p in s.models.params("m")]
            assert names == [Q, *(f"{Q}[head={h}]" for h in range(3))]
            for h in range(3):
                np.testing.assert_array_equal(
                    np.asarray(s.store.load_weights("m", f"{Q}[head={h}]")), q[8 * h:8 * h + 8])

    def test_the_command_line_reads_it_too(self, tmp_path, capsys):
        path, _ = _single_file(tmp_path / "ck", config={"num_attention_heads": 3,
                                                        "hidden_size": 24})
        assert main(["analyze", str(path), "--views", "heads", "--metrics", "frob_norm",
                     "--format", "csv"]) == 0
        assert f"{Q}[head=2]" in capsys.readouterr().out


class TestMessagesInTheInterfacesWords:
    def test_python_says_view_options(self, tmp_path):
        path, _ = _single_file(tmp_path / "ck", config=None)
        with Session() as s, pytest.raises(ModelSourceError, match=r'pass view_options=\{"heads": '
                                                                   r'N\} \(and kv_heads'):
            s.models.add(path, "m", views=["heads"])

    def test_the_command_line_says_view_option(self, tmp_path, capsys):
        path, _ = _single_file(tmp_path / "ck", config=None)
        assert main(["analyze", str(path), "--views", "heads"]) == 2
        err = capsys.readouterr().err
        assert "pass --view-option heads=N (and kv_heads, head_dim)" in err
        assert "view_options" not in err


class TestEmptyRuleLists:
    @pytest.mark.parametrize("views", [",", " , ", ""])
    def test_the_command_line_refuses_an_empty_list(self, tmp_path, capsys, views):
        """--views , exited 0 and did nothing."""
        path, _ = _single_file(tmp_path / "ck", config=None)
        assert main(["analyze", str(path), "--views", views]) == 2
        assert "names no view rule" in capsys.readouterr().err

    @pytest.mark.parametrize("views", [",", [], ()])
    def test_python_refuses_an_empty_list(self, tmp_path, views):
        path, _ = _single_file(tmp_path / "ck", config=None)
        with Session() as s:
            with pytest.raises(InvalidArgumentError, match="names no view rule"):
                s.models.add(path, "m", views=views)
            assert s.models.model_ids == []
