"""DiffractCallback in a real Hugging Face Trainer: a tiny LlamaForCausalLM built from a
config (no download), ``report_to="tensorboard"``. TensorBoard's own reader finds the
documented tags at the analysed steps, with the values of ``diffract analyze`` on the
checkpoints the Trainer saved at those steps; a resumed run adds no step twice."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tensorboard")

from diffract import Session  # noqa: E402
from diffract_training import DiffractCallback  # noqa: E402

METRICS = ("stable_rank", "spectral_norm")
Q0 = "model.layers.0.self_attn.q_proj.weight"


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 64) -> None:
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 96, (n, 12), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(out: Path, steps: int, store: Path, **callback):
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=4,
        learning_rate=1e-2, save_strategy="steps", save_steps=4, logging_steps=100,
        report_to="tensorboard", use_cpu=True, seed=0,
        data_seed=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens())
    callback = {"every": 4, **callback}
    cb = DiffractCallback(trainer, metrics=METRICS, store=store, background=False, **callback)
    trainer.add_callback(cb)
    return trainer, cb


def _events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = [p.parent for p in folder.rglob("events.out.tfevents.*")]
    assert runs, f"no event file under {folder}"
    events = EventAccumulator(str(runs[0]), size_guidance={"scalars": 0, "histograms": 0})
    return events.Reload()


def test_trainer_logs_the_documented_tags_with_the_checkpoints_values(tmp_path):
    trainer, cb = _trainer(tmp_path / "out", 8, tmp_path / "run.diffract")
    trainer.train()
    assert cb.monitor.closed and cb.monitor.analysed == [4, 8]
    assert not [t for t in threading.enumerate() if t.name.startswith("diffract-monitor")]
    events = _events(tmp_path / "out" / "runs")
    tag = f"train/diffract/stable_rank/{Q0}"  # the Trainer's TensorBoard writer adds train/
    assert tag in events.Tags()["scalars"]
    assert f"diffract/esd/{Q0}" in events.Tags()["histograms"]
    logged = {e.step: e.value for e in events.Scalars(tag)}
    assert sorted(logged) == [4, 8]
    for step in (4, 8):
        with Session() as s:
            s.models.add(tmp_path / "out" / f"checkpoint-{step}", "ck")
            s.compute.apply(*METRICS)
            want = s.results.export_metrics(*METRICS)["ck"]
        assert logged[step] == np.float32(want[Q0]["stable_rank"])  # TensorBoard's float32
        with Session("local", path=str(tmp_path / "run.diffract")) as s:
            stored = s.results.export_metrics(*METRICS)[f"step-{step}"]
        assert len(stored) == 16  # 7 matrices a layer, the embeddings, the head
        for param, row in stored.items():
            assert row == want[param], param


def test_a_resumed_trainer_continues_the_store_without_doubling(tmp_path):
    first, _ = _trainer(tmp_path / "out", 8, tmp_path / "run.diffract")
    first.train()
    again, cb = _trainer(tmp_path / "out", 12, tmp_path / "run.diffract")
    again.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-4"))
    assert cb.monitor.analysed == [12]  # 8 was analysed by the first run
    with Session("local", path=str(tmp_path / "run.diffract")) as s:
        steps = sorted(s.models.steps()[m]["step"] for m in s.model_ids)
    assert steps == [4, 8, 12]


@pytest.mark.parametrize("every", [None, 4], ids=["saves-only", "live-and-saves"])
def test_on_save_analyses_the_checkpoint_the_trainer_wrote(tmp_path, every):
    """``on_save=True`` analyses each checkpoint from its files (its values are those of
    the folder); a step analysed live is not analysed again from its file."""
    trainer, cb = _trainer(tmp_path / "out", 8, tmp_path / "run.diffract", on_save=True,
                           every=every)
    trainer.train()
    assert cb.monitor.analysed == [4, 8] and cb.monitor.skipped == []
    with Session("local", path=str(tmp_path / "run.diffract")) as s:
        stored = s.results.export_metrics(*METRICS)
        assert sorted(s.models.steps()[m]["step"] for m in s.model_ids) == [4, 8]
    for step in (4, 8):
        with Session() as s:
            s.models.add(tmp_path / "out" / f"checkpoint-{step}", "ck")
            s.compute.apply(*METRICS)
            want = s.results.export_metrics(*METRICS)["ck"]
        assert stored[f"step-{step}"] == want


def test_views_get_the_values_of_the_saved_checkpoints_heads(tmp_path):
    """``views=["heads"]``: each head of each attention projection is logged and stored
    with the view metrics, equal to an analysis of the saved checkpoint's heads."""
    from diffract_training import VIEW_METRICS

    trainer, cb = _trainer(tmp_path / "out", 4, tmp_path / "run.diffract", views=["heads"])
    trainer.train()
    assert cb.monitor.analysed == [4]
    with Session() as s:
        s.models.add(tmp_path / "out" / "checkpoint-4", "ck", views=["heads"])
        heads = [p.name for p in s.models.params("ck") if p.parent is not None]
        s.filter(param_names=heads).compute.apply(*VIEW_METRICS, errors="record")
        want = s.results.export_metrics(*VIEW_METRICS)["ck"]
    with Session("local", path=str(tmp_path / "run.diffract")) as s:
        stored = s.results.export_metrics(*VIEW_METRICS)["step-4"]
    assert f"{Q0}[head=0]" in heads and len(heads) >= 4 * 2 * 2  # q and o heads, two layers
    for head in heads:
        for field in VIEW_METRICS:
            got, expected = stored[head][field], want[head][field]
            assert got == expected or (np.isnan(got) and np.isnan(expected)), (head, field)


def test_the_documented_form_reaches_tensorboard_in_the_trainers_event_file(tmp_path):
    """Trainer(..., callbacks=[DiffractCallback(...)]) as transformers' docs pass
    callbacks (no trainer given to it): the values reach report_to's TensorBoard, in the
    one event file that holds the trainer's own scalars, at the analysed steps; the
    final step (6, no cadence point) is analysed at the end of training and logged at 6
    before the trainer's writer closes."""
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=4,
        learning_rate=1e-2, save_strategy="no", logging_steps=2, report_to=["tensorboard"],
        use_cpu=True, seed=0, disable_tqdm=True)
    cb = DiffractCallback(every=4, metrics=METRICS, histograms=False)  # background, default
    trainer = transformers.Trainer(model=transformers.LlamaForCausalLM(config), args=args,
                                   train_dataset=_Tokens(), callbacks=[cb])
    trainer.train()
    files = list((tmp_path / "out" / "runs").rglob("events.out.tfevents.*"))
    assert len(files) == 1, files
    events = _events(tmp_path / "out" / "runs")
    tag = f"train/diffract/stable_rank/{Q0}"
    assert tag in events.Tags()["scalars"] and "train/loss" in events.Tags()["scalars"]
    assert [e.step for e in events.Scalars(tag)] == [4, 6] and cb.monitor.analysed == [4, 6]
    final = dict(cb.monitor.latest("stable_rank"))[Q0]
    assert final[0] == 6 and events.Scalars(tag)[-1].value == np.float32(final[1])
    with Session() as s:  # the final values are the final weights'
        s.models.add({k: v.detach().clone() for k, v in trainer.model.named_parameters()},
                     "final")
        s.compute.apply("stable_rank")
        assert s.results.export_metrics("stable_rank")["final"][Q0]["stable_rank"] == final[1]


def test_without_a_handler_or_trainer_report_to_is_refused_at_the_start(tmp_path):
    """A loop calling the events itself: the values could reach no tracker of report_to;
    refused at on_train_begin with the form that works."""
    from diffract.errors import InvalidArgumentError

    cb = DiffractCallback(every=4, metrics=METRICS)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=["tensorboard"],
                                          use_cpu=True)
    with pytest.raises(InvalidArgumentError, match=r"add it with trainer.add_callback\("
                                                   r"DiffractCallback\(trainer, \.\.\.\)\)"):
        cb.on_train_begin(args, transformers.TrainerState(), transformers.TrainerControl())
    cb.monitor.close()
