"""DeepSpeed ZeRO checkpoints (issue 35 item 3), written by DeepSpeed itself on the CPU
by two gloo ranks at stages 2 and 3: the weights Diffract reads are DeepSpeed's own
``zero_to_fp32`` reconstruction, bit for bit; a run of ``global_step*`` folders tracks by
step; a file whose pickle would run code runs nothing; a missing rank is refused."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
if not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from diffract import Session  # noqa: E402
from diffract.errors import ModelSourceError  # noqa: E402
from diffract_formats.deepspeed_reader import DeepSpeedReader  # noqa: E402

_RANK = textwrap.dedent("""
    import os, sys
    rank, port, stage, out = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    aligned = sys.argv[5] == "aligned"
    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                      RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_SIZE="2")
    import torch, deepspeed
    import deepspeed.comm.torch
    # its shared-memory allreduce compiles C++ (minutes): not needed. The module itself,
    # from sys.modules: `import deepspeed.comm.torch as comm` binds torch (deepspeed.comm
    # has an attribute named torch), and the patch then missed.
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 15)
            self.b = torch.nn.Linear(15, 4)
            self.c = torch.nn.Linear(4, 3, bias=False)
            self.register_buffer("scale", torch.linspace(0.5, 1.5, 3))

        def forward(self, x):
            return self.c(self.b(self.a(x))) * self.scale

    torch.manual_seed(0)
    model = Net()
    # parameter_alignment: each parameter starts on 16 bytes (a.bias, 15 floats, is
    # followed by one of padding): the parameters after it lie one entry further on
    config = {"train_batch_size": 4,
              "zero_optimization": {"stage": stage, "parameter_alignment": aligned},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config, dist_init_required=True)
    gen = torch.Generator().manual_seed(rank)
    for step in (1, 2):
        loss = engine(torch.randn(2, 8, generator=gen)).pow(2).sum()
        engine.backward(loss)
        engine.step()
        engine.save_checkpoint(out)
    # Both ranks done before the group goes; then leave without the interpreter's
    # teardown, where gloo's C++ threads sometimes abort a finished process
    # ("terminate called without an active exception": a CI run lost stage 2's fixture).
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
""")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module", params=["2", "3", "2-aligned"])
def saved(request, tmp_path_factory) -> tuple[int, Path]:
    """A ZeRO checkpoint folder (global_step1/, global_step2/, latest) of two ranks; at
    stage 2 also with each parameter aligned (alignment padding inside a group)."""
    stage, aligned = int(request.param[0]), request.param.endswith("aligned")
    root = tmp_path_factory.mktemp(f"zero{request.param}")
    script = root / "rank.py"
    script.write_text(_RANK)
    port = str(_free_port())
    extensions = root / "torch_extensions"  # where a JIT build would land: none may
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCH_EXTENSIONS_DIR": str(extensions)}
    ranks = [subprocess.Popen([sys.executable, str(script), str(r), port, str(stage),
                               str(root / "ck"), "aligned" if aligned else "plain"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for r in (0, 1)]
    for proc in ranks:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    built = sorted(p.name for p in extensions.rglob("*")) if extensions.exists() else []
    assert not built, f"writing the fixture compiled DeepSpeed's C++ ops: {built}"
    if aligned:  # the padding lies inside the group, not only at its end
        state = torch.load(next((root / "ck" / "global_step2").glob("*rank_0*optim*")),
                           weights_only=False)["optimizer_state_dict"]  # our own file
        assert any(any(pads[:-1]) for pads in state["param_alignment_paddings"])
    return stage, root / "ck"


def _reference(folder: Path, tag: str) -> dict:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    # DeepSpeed's own reconstruction (it unpickles with weights_only=False: our own files)
    return {k: v.contiguous() for k, v in get_fp32_state_dict_from_zero_checkpoint(
        str(folder), tag=tag).items()}


def test_the_weights_are_deepspeeds_own_reconstruction(saved):
    stage, folder = saved
    for tag in ("global_step1", "global_step2"):
        want = _reference(folder, tag)
        reader = DeepSpeedReader(str(folder / tag))
        got = {e.name: reader.read(e.name) for e in reader.entries()}
        assert sorted(got) == sorted(want) == ["a.bias", "a.weight", "b.bias", "b.weight",
                                               "c.weight", "scale"]
        for name, value in want.items():
            assert got[name].dtype == value.dtype and torch.equal(got[name], value), name
    # the save folder itself reads its 'latest'
    latest = DeepSpeedReader(str(folder))
    assert torch.equal(latest.read("b.weight"), _reference(folder, "global_step2")["b.weight"])
    assert torch.equal(latest.read("b.weight", ((1, 3, 1),)),
                       _reference(folder, "global_step2")["b.weight"][1:3])


def test_a_run_of_global_step_folders_tracks_by_step(saved, tmp_path, capsys):
    from diffract.cli import main

    stage, folder = saved
    run = tmp_path / "run"
    run.mkdir()
    for tag in ("global_step1", "global_step2"):
        (run / tag).symlink_to(folder / tag, target_is_directory=True)
    assert main(["track", str(run), "--store", str(tmp_path / "s"), "--metrics",
                 "stable_rank", "--executor", "sequential"]) == 0
    assert "added 2 checkpoint(s): global_step1, global_step2" in capsys.readouterr().out
    with Session("local", path=str(tmp_path / "s")) as s:
        assert [s.models.steps()[m]["step"] for m in s.models.ordered()] == [1, 2]
        stored = s.results.export_metrics("stable_rank")
    with Session() as s:
        s.models.add({k: v for k, v in _reference(folder, "global_step2").items()
                      if v.dim() == 2}, "ref")
        s.compute.apply("stable_rank")
        want = s.results.export_metrics("stable_rank")["ref"]
    for name, row in want.items():
        assert stored["global_step2"][name]["stable_rank"] == row["stable_rank"]


def _copy(folder: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(folder / "global_step1", target)
    return target


def test_a_pickle_that_would_run_code_runs_nothing(saved, tmp_path):
    stage, folder = saved
    copy = _copy(folder, tmp_path)
    marker = tmp_path / "pwned"

    class Touch:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"optimizer_state_dict": {"zero_stage": Touch(), "partition_count": 2}},
               copy / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    with pytest.raises(ModelSourceError):
        DeepSpeedReader(str(copy))
    assert not marker.exists()


def test_a_missing_rank_is_refused(saved, tmp_path):
    stage, folder = saved
    copy = _copy(folder, tmp_path)
    (copy / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(ModelSourceError, match="written by 2 ranks and holds 1"):
        DeepSpeedReader(str(copy))


def test_a_step_folder_or_a_rank_file_linking_out_is_refused(saved, tmp_path):
    """The save folder's ``latest`` naming a step folder that is a link elsewhere, or a
    rank's file linking out of its step folder: refused by the one inside rule."""
    stage, folder = saved
    save = tmp_path / "save"
    save.mkdir()
    (save / "latest").write_text("global_step2")
    (save / "global_step2").symlink_to(folder / "global_step2", target_is_directory=True)
    with pytest.raises(ModelSourceError, match=r"'global_step2' resolves to .*, outside the "
                                               r"checkpoint's folder"):
        DeepSpeedReader(str(save))
    copy = _copy(folder, tmp_path)
    rank1 = copy / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    rank1.unlink()
    rank1.symlink_to(folder / "global_step1" / rank1.name)
    with pytest.raises(ModelSourceError, match=r"'zero_pp_rank_1_mp_rank_00_optim_states.pt' "
                                               r"resolves to .*, outside the checkpoint"):
        DeepSpeedReader(str(copy))
