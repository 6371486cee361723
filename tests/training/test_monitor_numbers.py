"""Numbers the monitor shows that a wrong answer would change (issue 58): the summary's
means are over whole matrices (head views left out), the default view metrics give every
head a value, a resumed run leaves the steps in its store alone, the launcher's RANK
decides who writes, and the Hugging Face callback logs a background analysis at the step
analysed."""

from __future__ import annotations

import logging
import math
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

from diffract import Session  # noqa: E402
from diffract_training import VIEW_METRICS, Monitor  # noqa: E402


def _llama(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config)


def _logged(monitor_kwargs: dict, model=None) -> dict[str, float]:
    got: dict[int, dict[str, float]] = {}
    with Monitor(model or _llama(), every=1, histograms=False, background=False,
                 log=lambda values, step: got.setdefault(step, values),
                 **monitor_kwargs) as monitor:
        monitor.step(1)
    return got[1]


def test_the_summary_means_are_over_whole_matrices_not_their_heads():
    values = _logged({"metrics": ["stable_rank"], "views": ["heads"],
                      "view_metrics": ["stable_rank"]})
    whole = [v for k, v in values.items() if k.startswith("diffract/stable_rank/")
             and "[" not in k]
    heads = [v for k, v in values.items() if k.startswith("diffract/stable_rank/") and "[" in k]
    assert len(heads) == 2 * (4 + 2 + 2 + 4) and len(whole) >= 14
    assert values["diffract/summary/stable_rank_mean"] == pytest.approx(np.mean(whole),
                                                                         rel=1e-12)
    assert values["diffract/summary/stable_rank_max"] == max(whole)
    assert np.mean(whole + heads) != pytest.approx(np.mean(whole), rel=1e-3)


def test_the_default_view_metrics_give_every_head_a_value():
    """The views' defaults are those ``diffract analyze --views`` gives them, and each is
    defined on a head of a small model (one undefined there would drop every per-head
    value without a word)."""
    from diffract_report._inputs import VIEW_METRICS as CLI_VIEW_METRICS

    assert VIEW_METRICS == CLI_VIEW_METRICS
    values = _logged({"metrics": ["stable_rank"], "views": ["heads"]})
    heads = {k.split("/", 2)[2] for k in values if "[" in k}
    assert len(heads) == 2 * (4 + 2 + 2 + 4)
    for field in VIEW_METRICS:
        got = [values.get(f"diffract/{field}/{head}") for head in heads]
        assert all(v is not None and math.isfinite(v) for v in got), field


def test_a_resumed_run_leaves_the_steps_in_its_store_alone(tmp_path, caplog):
    """A second run on the store analyses only the steps the first did not (without a
    word: no step is tried again and refused); the values stored for the first run's
    steps are still the first run's."""
    store = tmp_path / "run.diffract"
    model = _llama()
    with Monitor(model, every=2, metrics=["stable_rank"], store=store, histograms=False,
                 background=False) as first:
        for step in (1, 2, 3, 4):
            first.step(step)
    with Session("local", path=str(store)) as s:
        before = s.results.export_metrics("stable_rank")
    with torch.no_grad():  # the resumed model differs: a step analysed again would show it
        for p in model.parameters():
            p.mul_(1.5)
    with caplog.at_level("WARNING", logger="diffract_training"), Monitor(
            model, every=2, metrics=["stable_rank"], store=store, histograms=False,
            background=False, final=False) as second:
        for step in range(1, 7):
            second.step(step)
    assert second.analysed == [6] and second.skipped == []
    assert [r.getMessage() for r in caplog.records if r.name == "diffract_training"] == []
    with Session("local", path=str(store)) as s:
        after = s.results.export_metrics("stable_rank")
        assert sorted(s.models.steps()[m]["step"] for m in s.model_ids) == [2, 4, 6]
    assert {m: after[m] for m in before} == before


@pytest.mark.parametrize("env, writes", [({"RANK": "3", "LOCAL_RANK": "0"}, False),
                                         ({"RANK": "0", "LOCAL_RANK": "0"}, True),
                                         ({"LOCAL_RANK": "1"}, False)])
def test_the_launchers_global_rank_decides_who_writes(tmp_path, monkeypatch, env, writes):
    """torchrun's RANK is the global rank: the first process of a second node (RANK=3,
    LOCAL_RANK=0) neither writes the store nor logs; LOCAL_RANK only when RANK is not
    set."""
    for key in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    logged = []
    with Monitor(_llama(), every=1, metrics=["stable_rank"], store=tmp_path / "s",
                 histograms=False, background=False,
                 log=lambda values, step: logged.append(step)) as monitor:
        monitor.step(1)
    assert monitor.writer is writes
    assert (logged == [1]) is writes and (tmp_path / "s").exists() is writes


class _Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        ids = torch.arange(i, i + 8) % 64
        return {"input_ids": ids, "labels": ids}


def test_the_trainer_logs_a_background_analysis_at_the_step_analysed(tmp_path):
    """Step 4's analysis (in the background, the default) cannot finish before the
    trainer reaches step 5 (a kernel waits for it): its values still go to TensorBoard
    at step 4, the final weights' at 6."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from diffract_training import DiffractCallback

    release = threading.Event()

    def t_gated(weights) -> float:
        assert release.wait(timeout=600), "the trainer never reached step 5"
        return float(weights.shape[0])

    with Session() as s:  # the process's registry (reset for each test)
        s.compute.kernel(name="t_gated")(t_gated)

    class Release(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                release.set()

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=4,
        learning_rate=1e-2, save_strategy="no", logging_steps=100, report_to=["tensorboard"],
        use_cpu=True, seed=0, disable_tqdm=True)
    cb = DiffractCallback(every=4, metrics=["stable_rank", "t_gated"], histograms=False)
    transformers.Trainer(model=_llama(), args=args, train_dataset=_Tokens(),
                         callbacks=[Release(), cb]).train()
    assert release.is_set() and cb.monitor.analysed == [4, 6]
    files = list((tmp_path / "out" / "runs").rglob("events.out.tfevents.*"))
    events = EventAccumulator(str(files[0].parent))
    events.Reload()
    tag = "train/diffract/summary/stable_rank_mean"
    assert [e.step for e in events.Scalars(tag)] == [4, 6]


def test_lightning_logs_a_background_analysis_at_the_step_analysed(tmp_path):
    """Lightning's twin of the Trainer's test: with the default ``background=True``, step
    4's analysis cannot finish before the trainer reaches step 5 (a kernel waits for
    it), and its values still reach TensorBoard at step 4, equal to an analysis of the
    weights saved at step 4; the final weights' at 6."""
    L = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.loggers import TensorBoardLogger
    from safetensors.torch import save_file
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from diffract_training import DiffractLightningCallback

    release = threading.Event()

    def t_held(weights) -> float:
        assert release.wait(timeout=600), "the trainer never reached step 5"
        return float(weights.shape[0])

    with Session() as s:
        s.compute.kernel(name="t_held")(t_held)

    from tests.resources.lightning import module

    torch.manual_seed(0)
    net = module(torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.Tanh(),
                                     torch.nn.Linear(64, 4)))
    x = torch.randn(96, 40, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=8)

    class _Release(L.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            if trainer.global_step == 4:
                save_file({k: v.detach().clone() for k, v in module.state_dict().items()},
                          str(tmp_path / "s4.safetensors"))
            if trainer.global_step == 5:
                release.set()

    cb = DiffractLightningCallback(every=4, metrics=["stable_rank", "t_held"],
                                   histograms=False)
    assert cb.monitor.background
    L.Trainer(max_steps=6, accelerator="cpu", devices=1, enable_checkpointing=False,
              logger=TensorBoardLogger(str(tmp_path / "logs"), name="", version=0),
              callbacks=[cb, _Release()], enable_progress_bar=False,
              enable_model_summary=False).fit(net, train_dataloaders=data)
    assert release.is_set() and cb.monitor.analysed == [4, 6]
    events = EventAccumulator(str(tmp_path / "logs" / "version_0"))
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("diffract/stable_rank/net.0.weight")}
    assert sorted(logged) == [4, 6]
    with Session() as s:
        s.models.add(tmp_path / "s4.safetensors", "ck")
        s.compute.apply("stable_rank")
        want = s.results.export_metrics("stable_rank")["ck"]["net.0.weight"]["stable_rank"]
    assert logged[4] == np.float32(want)
