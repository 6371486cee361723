"""The front ends under torch.distributed on the CPU (gloo), as users launch them: the
Hugging Face Trainer under ``torchrun --nproc_per_node 2`` with ``DiffractCallback`` and a
schedule in ``callbacks=[...]``, and Lightning's DDP strategy with two processes and
``DiffractLightningCallback``. Each: the same learning rates on both ranks at every step,
the values reach the trackers once (rank 0's TensorBoard event file), the store holds each
analysed step once, and the final weights are analysed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensorboard")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from diffract import Session  # noqa: E402

#: How each script ends: both ranks done before the group goes, then out without the
#: interpreter's teardown, where gloo's C++ threads sometimes abort a finished process
#: ("terminate called without an active exception", seen in CI beside other tests).
_LEAVE = """
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""

_HF = textwrap.dedent("""
    import json, os, sys
    import torch, transformers
    from diffract_training import DiffractCallback, TempBalance

    out = sys.argv[1]
    rank = int(os.environ["RANK"])
    ids = torch.randint(0, 96, (64, 12), generator=torch.Generator().manual_seed(0))

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return len(ids)

        def __getitem__(self, i):
            return {"input_ids": ids[i], "labels": ids[i]}

    lrs = {}

    class Record(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            lrs[state.global_step] = [g["lr"] for g in optimizer.param_groups]

    config = transformers.LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    args = transformers.TrainingArguments(
        output_dir=out + "/out", max_steps=6, per_device_train_batch_size=4,
        learning_rate=1e-2, save_strategy="steps", save_steps=6, logging_steps=100,
        report_to="tensorboard", use_cpu=True, ddp_backend="gloo", seed=0, data_seed=0,
        disable_tqdm=True)
    callback = DiffractCallback(every=4, metrics=["stable_rank", "pl_alpha_hill"],
                                store=out + "/run.diffract", background=True,
                                views=["heads"],
                                schedules=[TempBalance(every=2, min_eigenvalues=0)])
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(),
                                   callbacks=[callback, Record()])
    trainer.train()
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump({"lrs": lrs, "analysed": callback.monitor.analysed,
                   "share": callback.monitor._mine}, fh)""")

_LIGHTNING = textwrap.dedent("""
    import json, os, sys
    import torch
    import lightning.pytorch as L
    from lightning.pytorch.loggers import TensorBoardLogger
    from safetensors.torch import save_file
    from diffract_training import DiffractLightningCallback, AlphaDecay

    out = sys.argv[1]

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.Tanh(),
                                           torch.nn.Linear(64, 48), torch.nn.Tanh(),
                                           torch.nn.Linear(48, 4))

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return self.net(x).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.1)

        def train_dataloader(self):
            x = torch.randn(256, 40, generator=torch.Generator().manual_seed(0))
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x),
                                               batch_size=8)

    decays = {}

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            step = trainer.global_step
            decays[step] = [g["weight_decay"] for g in trainer.optimizers[0].param_groups]
            if step == 6 and trainer.global_rank == 0:
                save_file({k: v.detach().clone() for k, v in module.state_dict().items()},
                          f"{out}/final.safetensors")

    callback = DiffractLightningCallback(
        every=4, metrics=["stable_rank", "log_norm"], store=out + "/run.diffract",
        background=True, schedules=[AlphaDecay(every=2, remove_first=False,
                                               remove_last=False, min_eigenvalues=0)])
    trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=2, strategy="ddp",
                        logger=TensorBoardLogger(out + "/logs", name="", version=0),
                        callbacks=[callback, Record()], enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(Net())
    with open(f"{out}/rank{trainer.global_rank}.json", "w") as fh:
        json.dump({"decays": decays, "analysed": callback.monitor.analysed,
                   "share": callback.monitor._mine}, fh)""")


def _events(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list(folder.rglob("events.out.tfevents.*"))
    out: dict[str, list[tuple[int, float]]] = {}
    for f in files:
        events = EventAccumulator(str(f), size_guidance={"scalars": 0}).Reload()
        for tag in events.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in events.Scalars(tag))
    return out


def _launch(cmd: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _stored_steps(store: Path) -> list[int]:
    with Session("local", path=str(store)) as s:
        return sorted(s.models.steps()[m]["step"] for m in s.model_ids)


def test_hf_trainer_under_torchrun_with_a_schedule(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "hf.py").write_text(_HF + _LEAVE)
    _launch([sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc_per_node", "2", "hf.py", str(tmp_path)], tmp_path)
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert zero["lrs"] == one["lrs"] and sorted(map(int, zero["lrs"])) == [1, 2, 3, 4, 5, 6]
    assert len({tuple(v) for v in zero["lrs"].values()}) > 1  # the schedule moved them
    assert zero["share"] and one["share"] and not set(zero["share"]) & set(one["share"])
    # The store: steps 4 and 6 (the final weights), each once, with the values of the
    # checkpoint the trainer saved at the end.
    assert zero["analysed"] == [4, 6] and _stored_steps(tmp_path / "run.diffract") == [4, 6]
    with Session() as s:  # the head views too, each computed on the rank of its matrix
        s.models.add(tmp_path / "out" / "checkpoint-6", "ck", views=["heads"])
        s.compute.apply("stable_rank", errors="record")
        want = s.results.export_metrics("stable_rank")["ck"]
    assert "model.layers.1.self_attn.k_proj.weight[head=1]" in want
    with Session("local", path=str(tmp_path / "run.diffract")) as s:
        got = s.results.export_metrics("stable_rank")["step-6"]
    assert got == want
    # The trackers: one event file's worth (rank 0's), each analysed step once.
    scalars = _events(tmp_path / "out")
    q = "train/diffract/stable_rank/model.layers.0.self_attn.q_proj.weight"
    assert sorted(step for step, _ in scalars[q]) == [4, 6]


def test_lightning_ddp_with_two_processes_and_a_schedule(tmp_path):
    pytest.importorskip("lightning.pytorch")
    (tmp_path / "fit.py").write_text(_LIGHTNING + _LEAVE)
    _launch([sys.executable, "fit.py", str(tmp_path)], tmp_path)
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert zero["decays"] == one["decays"] and sorted(map(int, zero["decays"])) == list(
        range(1, 7))
    assert len({tuple(v) for v in zero["decays"].values()}) > 1
    assert sorted(zero["share"] + one["share"]) == ["net.0.weight", "net.2.weight",
                                                    "net.4.weight"]
    assert zero["analysed"] == [4, 6] and _stored_steps(tmp_path / "run.diffract") == [4, 6]
    with Session() as s:
        s.models.add(tmp_path / "final.safetensors", "ck")
        s.compute.apply("stable_rank", "log_norm", errors="record")
        want = s.results.export_metrics("stable_rank", "log_norm")["ck"]
    with Session("local", path=str(tmp_path / "run.diffract")) as s:
        got = s.results.export_metrics("stable_rank", "log_norm")["step-6"]
    assert got == want
    scalars = _events(tmp_path / "logs")
    assert sorted(step for step, _ in scalars["diffract/stable_rank/net.0.weight"]) == [4, 6]
