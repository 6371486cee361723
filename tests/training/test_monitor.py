"""diffractml-training's Monitor in a plain PyTorch loop: the values equal an analysis of
the checkpoint saved at the same step, bit for bit; the store holds each analysed step
once, across a killed and resumed run; a failing kernel never stops training; nothing is
left running; bad settings are refused before the first step."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from diffract import Session  # noqa: E402
from diffract.errors import DiffractError, InvalidArgumentError, UnknownFieldError  # noqa: E402
from diffract_training import DEFAULT_METRICS, Monitor  # noqa: E402

METRICS = ("pl_alpha", "stable_rank", "log_norm", "spectral_norm")


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(160, 120), torch.nn.Tanh(),
                               torch.nn.Linear(120, 110), torch.nn.Tanh(),
                               torch.nn.Linear(110, 8))


def _train(model, steps, on_step, start: int = 0):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(start)
    for step in range(start + 1, steps + 1):
        x = torch.randn(16, 160, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        on_step(step)


def _analyze(path: Path, metrics=METRICS) -> dict:
    with Session() as s:
        s.models.add(path, "ck")
        s.compute.apply(*metrics, errors="record")
        return s.results.export_metrics(*metrics)["ck"]


def test_values_equal_an_analysis_of_the_checkpoint_saved_at_that_step(tmp_path):
    """Every analysed step's per-layer values (logged and stored) are those of
    ``diffract analyze`` on the safetensors file saved at that step, bit for bit."""
    model = _net()
    logged: dict[int, dict[str, float]] = {}
    monitor = Monitor(model, every=4, metrics=METRICS, store=tmp_path / "run",
                      log=lambda values, step: logged.setdefault(step, values),
                      background=False)

    def on_step(step):
        monitor.step(step)
        if step % 4 == 0:
            safetensors_torch.save_file(model.state_dict(), str(tmp_path / f"s{step}.safetensors"))

    with monitor:
        _train(model, 12, on_step)
    assert sorted(logged) == [4, 8, 12] and monitor.analysed == [4, 8, 12]
    with Session("local", path=str(tmp_path / "run")) as s:
        stored = s.results.export_metrics(*METRICS)
        assert sorted(s.models.ordered()) == ["step-12", "step-4", "step-8"]
        frame = s.results.trajectory("stable_rank")
        assert list(frame.index) == [4, 8, 12]
    for step in (4, 8, 12):
        want = _analyze(tmp_path / f"s{step}.safetensors")
        assert set(want) == {"0.weight", "2.weight", "4.weight"}
        for param, row in want.items():
            for field in METRICS:
                got = stored[f"step-{step}"][param][field]
                assert got == row[field] or (np.isnan(got) and np.isnan(row[field])), \
                    (step, param, field)
                if np.isfinite(row[field]):
                    assert logged[step][f"diffract/{field}/{param}"] == row[field]
        assert logged[step]["diffract/summary/stable_rank_mean"] == pytest.approx(
            np.mean([want[p]["stable_rank"] for p in want]), rel=1e-15)


def test_a_busy_worker_skips_a_cadence_point_with_one_warning(tmp_path, caplog):
    """While an analysis runs, the next cadence points are skipped (one warning for the
    run), never queued; the loop goes on."""
    gate, entered = threading.Event(), threading.Event()

    def slow_rank(weights):
        entered.set()
        gate.wait(timeout=300)
        return float(np.linalg.matrix_rank(weights))

    with Session() as s:  # the registry is the process's (reset for each test)
        s.compute.kernel()(slow_rank)
    model = _net()
    monitor = Monitor(model, every=1, metrics=["slow_rank"])
    with caplog.at_level("WARNING", logger="diffract_training"):
        assert monitor.step(1)
        assert entered.wait(timeout=300)
        assert not monitor.step(2) and not monitor.step(3)
        gate.set()
        monitor.close()
    # 3 was skipped as a cadence point; close() analyses it as the final weights
    assert monitor.skipped == [2, 3] and monitor.analysed == [1, 3]
    assert sum("still running" in r.message for r in caplog.records) == 1


def test_a_kernel_that_raises_does_not_stop_training(tmp_path, caplog):
    """A failing field is logged once per parameter and reason; the others are logged;
    training completes and nothing of the monitor's keeps running."""
    def broken_rank(weights):
        raise RuntimeError("planted failure")

    with Session() as s:
        s.compute.kernel()(broken_rank)
    model = _net()
    got = {}
    monitor = Monitor(model, every=2, metrics=["stable_rank", "broken_rank"],
                      background=False, log=lambda values, step: got.setdefault(step, values))
    with caplog.at_level("WARNING", logger="diffract_training"):
        with monitor:
            _train(model, 6, monitor.step)
    assert sorted(got) == [2, 4, 6]
    assert all("diffract/stable_rank/0.weight" in v for v in got.values())
    planted = [r.message for r in caplog.records if "planted failure" in r.message]
    assert len(planted) == 3  # one per parameter, not one per step
    assert not [t for t in threading.enumerate() if t.name.startswith("diffract-monitor")]
    assert monitor._worker is not None and not monitor._worker.is_alive()



def test_the_analysis_keeps_openmp_to_one_thread_and_the_loop_keeps_its_own():
    """The monitor's thread runs at the process's priority and opens torch's OpenMP regions on one thread, after a
    ``torch.set_num_threads`` of the training script's too: a second team made GNU
    OpenMP stop spin-waiting for the loop's, and every step of a CPU run was 1.3-2x
    slower for the rest of the run (benchmarks/bench_training.py --whole)."""
    import os

    def omp_threads(weights):
        return float(torch.get_num_threads())

    def thread_nice(weights):
        return float(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    with Session() as s:
        s.compute.kernel()(omp_threads)
        s.compute.kernel()(thread_nice)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got: dict[str, float] = {}
        model = _net()
        with Monitor(model, every=1, metrics=["omp_threads", "thread_nice"],
                     log=lambda values, step: got.update(values)) as monitor:
            monitor.step(1)
            monitor.wait()
        seen = {k: v for k, v in got.items() if k.startswith("diffract/omp_threads/")}
        assert len(seen) == 3 and set(seen.values()) == {1.0}
        assert torch.get_num_threads() == 2
        # at the process's priority: at nice 19 the analysis starved on busy cores
        nice = {k: v for k, v in got.items() if k.startswith("diffract/thread_nice/")}
        assert len(nice) == 3
        assert set(nice.values()) == {float(os.getpriority(os.PRIO_PROCESS, 0))}
    finally:
        torch.set_num_threads(before)

_RUN = textwrap.dedent("""
    import os, signal, sys
    import torch
    sys.path.insert(0, {tests!r})
    from training.test_monitor import _net, _train
    from diffract_training import Monitor

    start, stop, kill_at = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    model = _net()
    if start:
        model.load_state_dict(torch.load(sys.argv[4], weights_only=True))
    monitor = Monitor(model, every=5, metrics=["stable_rank"], store=sys.argv[5],
                      background=kill_at == 0)

    def on_step(step):
        if step == 10:
            torch.save(model.state_dict(), sys.argv[4])
        started = monitor.step(step)
        if started and step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-analysis, or just after it
        if kill_at:
            monitor.wait()

    _train(model, stop, on_step, start)
    monitor.close()
""")


def test_a_killed_and_resumed_run_holds_every_step_once(tmp_path):
    """SIGKILL just after step 15's analysis starts; the run resumes from its step-10
    checkpoint and trains to 20: the store holds steps 5, 10, 15, 20, each once, and a
    step cut short is analysed again."""
    script = tmp_path / "run.py"
    script.write_text(_RUN.format(tests=str(Path(__file__).parents[1])))
    ckpt, store = tmp_path / "ck10.pt", tmp_path / "run.diffract"
    first = subprocess.run([sys.executable, str(script), "0", "20", "15", str(ckpt), str(store)],
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == -9, first.stderr
    with Session("local", path=str(store)) as s:
        before = sorted(s.models.steps()[m]["step"] for m in s.model_ids)
    assert before[:2] == [5, 10] and set(before) <= {5, 10, 15}
    second = subprocess.run([sys.executable, str(script), "10", "20", "0", str(ckpt), str(store)],
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    with Session("local", path=str(store)) as s:
        steps = sorted(s.models.steps()[m]["step"] for m in s.model_ids)
        values = s.results.export_metrics("stable_rank")
    assert steps == [5, 10, 15, 20]
    assert all(np.isfinite(values[f"step-{n}"]["0.weight"]["stable_rank"]) for n in steps)


def test_a_summary_writer_gets_scalars_and_esd_histograms(tmp_path):
    """TensorBoard's own reader finds the documented tags at the analysed steps."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    model = _net()
    writer = SummaryWriter(str(tmp_path / "tb"))
    with Monitor(model, every=3, metrics=["stable_rank", "warning"], log=writer,
                 background=False) as monitor:
        _train(model, 6, monitor.step)
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"histograms": 0}).Reload()
    tags = events.Tags()
    assert {"diffract/stable_rank/0.weight", "diffract/summary/stable_rank_mean",
            "diffract/summary/warning_share"} <= set(tags["scalars"])
    assert "diffract/esd/2.weight" in tags["histograms"]
    assert [e.step for e in events.Scalars("diffract/stable_rank/4.weight")] == [3, 6]
    assert [e.step for e in events.Histograms("diffract/esd/0.weight")] == [3, 6]


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"every": 0}, InvalidArgumentError, "at least 1"),
    ({"every": -5}, InvalidArgumentError, "at least 1"),
    ({"every": 2.5}, InvalidArgumentError, "whole number"),
    ({"metrics": ["pl_alpah"]}, UnknownFieldError, "Did you mean 'pl_alpha'"),
    ({"metrics": ["l_overlap"]}, InvalidArgumentError, "compares two models"),
    ({"metrics": []}, InvalidArgumentError, "empty"),
    ({"views": ["nonsuch"]}, DiffractError, "nonsuch"),
    ({"params": ["nothing.*"]}, InvalidArgumentError, "no parameter with two or more"),
    ({"log": 42}, InvalidArgumentError, "log takes a callable"),
], ids=["zero", "negative", "fraction", "unknown-metric", "pair-metric", "no-metric",
        "unknown-view", "no-matrix", "bad-sink"])
def test_bad_settings_are_refused_when_built(kwargs, error, match):
    with pytest.raises(error, match=match):
        Monitor(_net(), **kwargs)


def test_a_model_without_matrices_and_a_store_in_use(tmp_path):
    with pytest.raises(InvalidArgumentError, match="no parameter with two or more"):
        Monitor(torch.nn.LayerNorm(8))
    with Monitor(_net(), store=tmp_path / "run"):
        with pytest.raises(DiffractError, match="being written by another run"):
            Monitor(_net(), store=tmp_path / "run")
    Monitor(_net(), store=tmp_path / "run").close()  # free again once closed


def test_importing_the_package_imports_no_host_library():
    code = ("import sys, diffract_training; "
            "print(sorted(m for m in ('torch', 'transformers', 'tensorboard', 'lightning') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.strip() == "[]"


def test_the_default_metrics_are_known_fields():
    with Session() as s:
        known = {a for m in s.compute.list_available_metrics(True)
                 for a in (m["field"], *m["aliases"])}
    assert set(DEFAULT_METRICS) <= known


def _gated():
    """A kernel that holds the analysis at its first call until ``gate`` is set."""
    gate, entered = threading.Event(), threading.Event()

    def gated(weights):
        if not entered.is_set():
            entered.set()
            assert gate.wait(timeout=300)
        return float(weights.shape[0])

    with Session() as s:
        s.compute.kernel()(gated)
    return gate, entered


def _saved_step(model, path):
    safetensors_torch.save_file({k: v.clone() for k, v in model.state_dict().items()}, str(path))


@pytest.mark.parametrize("limit", [None, 0, 60_000], ids=["no-limit", "wait", "one-block"])
def test_the_copies_stay_within_copy_limit_and_hold_the_cadence_step(tmp_path, limit):
    """No copy at the cadence point: the analysis copies blocks in its own thread, as far
    ahead as ``copy_limit`` allows; when the optimizer steps first, the loop waits for
    what does not fit. The values are the cadence step's either way, equal to an
    analysis of the checkpoint saved there."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    gate, entered = _gated()
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    logged = {}
    # Registered before the monitor's hook, so it runs first: the optimizer's step has
    # begun while the analysis is held in its first block.
    hook = register_optimizer_step_pre_hook(
        lambda *a: gate.set() if limit is not None else None)
    monitor = Monitor(model, every=4, metrics=[*METRICS, "gated"], copy_limit=limit,
                      log=lambda values, step: logged.setdefault(step, values))
    try:
        gen = torch.Generator().manual_seed(0)
        for step in range(1, 7):
            loss = model(torch.randn(16, 160, generator=gen)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == 4:
                _saved_step(model, tmp_path / "s4.safetensors")
                assert monitor.step(4) and entered.wait(timeout=300)
            if step == 5:
                gate.set()
        monitor.close()
    finally:
        hook.remove()
        gate.set()
        monitor.close()
    sizes = {n: p.numel() * 4 for n, p in model.named_parameters() if p.ndim == 2}
    # Blocks only when the copies cannot all fit; else one apply for all.
    assert monitor._blocks == ([["0.weight", "2.weight", "4.weight"]] if limit is None
                               else [["0.weight"], ["2.weight", "4.weight"]])
    assert monitor.copied[4] == 0  # the analysis copied all, ahead or while the loop waited
    first = sizes["0.weight"]  # the block being analysed is copied whatever the limit
    assert monitor._taken[4].peak == {None: sum(sizes.values()), 0: first, 60_000: first}[limit]
    want = _analyze(tmp_path / "s4.safetensors")
    for param, row in want.items():
        for field in METRICS:
            if np.isfinite(row[field]):
                assert logged[4][f"diffract/{field}/{param}"] == row[field], (param, field)
    # what a finished step keeps is its numbers, no tensor (a long run keeps hundreds)
    assert not monitor._taken[4].tensors and not monitor._taken[4].live


def test_the_loop_copies_what_is_still_live_before_the_optimizer_steps():
    """The pre-hook's copy, made when the analysis has not reached a block (a race in a
    real run, called directly here): the copies keep the step's values after the update,
    and an in-place change made before the copy is reported stale."""
    from diffract_training._snapshot import Snapshot as _Snapshot

    model = _net()
    named = dict(model.named_parameters())
    live = {n: named[n] for n in ("0.weight", "2.weight")}
    sizes = {n: p.numel() * 4 for n, p in live.items()}
    before = {n: p.detach().clone() for n, p in live.items()}
    snap = _Snapshot(live, sizes, float("inf"), {})
    aliases = snap.aliases()
    assert aliases["0.weight"].untyped_storage().data_ptr() == \
        named["0.weight"].untyped_storage().data_ptr()  # an alias until then
    snap.before_update(lambda: False)
    assert snap.copied == sum(sizes.values()) and not snap.pending
    with torch.no_grad():
        for p in live.values():
            p.add_(1.0)
    for n in live:
        assert torch.equal(aliases[n], before[n])
    assert snap.stale == []
    spoiled = _Snapshot(live, sizes, float("inf"), {})  # no aliases yet: the copies stand in
    with torch.no_grad():
        named["2.weight"].mul_(2.0)
    spoiled.before_update(lambda: False)
    assert torch.equal(spoiled.aliases()["0.weight"], before["0.weight"] + 1.0)
    assert spoiled.stale == ["2.weight"]


def test_weights_changed_outside_an_optimizer_step_spoil_that_step(caplog):
    """An in-place change the optimizer hook cannot see (its version moved before the
    analysis copied it) drops the step with a warning instead of logging mixed values."""
    gate, entered = _gated()
    model = _net()
    logged = {}
    monitor = Monitor(model, every=1, metrics=["stable_rank", "gated"], copy_limit=0,
                      log=lambda values, step: logged.setdefault(step, values))
    with caplog.at_level("WARNING", logger="diffract_training"):
        assert monitor.step(1) and entered.wait(timeout=300)
        with torch.no_grad():
            model[2].weight.mul_(2.0)  # the second block, not copied yet (no room ahead)
        gate.set()
        monitor.close()
    assert logged == {} and monitor.analysed == []
    assert any("changed in place outside an optimizer step" in r.message
               for r in caplog.records)


def test_copy_limit_is_checked():
    for bad in (-1, 1.5, "all", True):
        with pytest.raises(InvalidArgumentError, match="copy_limit"):
            Monitor(_net(), copy_limit=bad)


def test_the_analysis_between_forward_and_backward_leaves_autograd_alone():
    """The analysis copies blocks while the loop holds a graph: backward still finds the
    parameters' versions it saved (an alias sharing their version counter would not)."""
    gate, entered = _gated()
    model = _net()
    monitor = Monitor(model, every=1, metrics=["stable_rank", "gated"], copy_limit=None)
    assert monitor.step(1) and entered.wait(timeout=300)
    loss = model(torch.randn(4, 160)).pow(2).mean()  # the graph saves the weights
    gate.set()
    monitor.wait()  # the analysis took its other blocks meanwhile
    loss.backward()
    monitor.close()
    assert monitor.analysed == [1] and model[0].weight.grad is not None


def test_diffract_track_reports_a_monitor_store_and_finds_its_event(tmp_path):
    """`diffract track --store S --report R` with no checkpoint paths reports the run a
    monitor wrote: its sudden-change detection finds a planted event at its step and
    layer, and the report is written; nothing is computed (the store has no weights)."""
    model = _net()
    store = tmp_path / "run.diffract"
    with Monitor(model, every=2, metrics=METRICS, store=store, background=False) as monitor:
        def on_step(step):
            if step == 12:
                with torch.no_grad():
                    model[2].weight.mul_(3.0)  # the event, before step 12's analysis
            monitor.step(step)
        _train(model, 20, on_step)
    report = tmp_path / "r.html"
    run = subprocess.run([sys.executable, "-m", "diffract.cli", "track", "--store", str(store),
                          "--report", str(report)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    first = lines[[i for i, line in enumerate(lines) if line.startswith("sudden changes")][0] + 1]
    assert first.split()[:3] == ["step", "12", "2.weight:"], run.stdout
    html = report.read_text()
    assert "Sudden changes" in html and "10 checkpoints" in html


@pytest.mark.parametrize(("extra", "match"), [
    (["--watch", "5"], "--watch polls for new checkpoints"),
    (["--metrics", "mp_softrank"], "holds no mp_softrank"),
], ids=["watch", "unstored-metric"])
def test_diffract_track_over_a_store_refuses_what_it_cannot_do(tmp_path, extra, match):
    store = tmp_path / "run.diffract"
    with Monitor(_net(), every=1, metrics=["stable_rank"], store=store,
                 background=False) as monitor:
        monitor.step(1)
    run = subprocess.run([sys.executable, "-m", "diffract.cli", "track", "--store", str(store),
                          *extra], capture_output=True, text=True, timeout=600)
    assert run.returncode == 2 and match in run.stderr, run.stderr


def test_diffract_track_over_an_empty_store_says_what_to_give(tmp_path):
    run = subprocess.run([sys.executable, "-m", "diffract.cli", "track", "--store",
                          str(tmp_path / "none.diffract")], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 2 and "holds no run yet" in run.stderr, run.stderr


def test_per_model_fields_are_logged_and_stored_as_an_analysis_of_the_matrices(tmp_path):
    """A per-model field (the docs accept them) is computed over the analysed matrices at
    each step, stored as the step's aggregate and logged as ``diffract/model/<field>``;
    it used to fail every step (a filtered view) with the copies already freed."""
    from safetensors.torch import save_file

    fields = ("model_log_norm", "total_numel", "param_norm")
    model = _net()
    logged: dict[int, dict[str, float]] = {}
    monitor = Monitor(model, every=2, metrics=("stable_rank", *fields),
                      store=tmp_path / "run", background=False,
                      log=lambda values, step: logged.setdefault(step, values))

    def on_step(step):
        if step % 2 == 0:
            save_file({n: p.detach().clone() for n, p in model.named_parameters()
                       if p.dim() == 2}, str(tmp_path / f"s{step}.safetensors"))
        monitor.step(step)

    _train(model, 4, on_step)
    monitor.close()
    assert sorted(logged) == [2, 4]
    for step in (2, 4):
        with Session() as s:
            s.models.add(tmp_path / f"s{step}.safetensors", f"step-{step}")
            s.compute.apply(*fields, errors="record")
            want = s.results.export_aggregates(*fields)
        assert len(want) == 3
        with Session("local", path=str(tmp_path / "run")) as s:
            assert s.filter(model_ids=[f"step-{step}"]).results.export_aggregates(
                *fields) == want
        for field in fields:
            assert logged[step][f"diffract/model/{field}"] == want[f"{field}@models[step-{step}]"]


def test_a_resumed_monitor_takes_none_of_the_steps_its_store_holds(tmp_path, caplog):
    """A run resumed from step 4 reaches step 8, which its store holds already: no
    snapshot, no analysis, no warning (a monitor that forgot its done steps analysed it
    again and logged DuplicateModelError); the new step 12 is analysed."""
    import logging

    model = _net()
    first = Monitor(model, every=4, metrics=METRICS, store=tmp_path / "run", background=False)
    _train(model, 8, first.step)
    first.close()
    again = Monitor(model, every=4, metrics=METRICS, store=tmp_path / "run", background=False)
    with caplog.at_level(logging.WARNING, logger="diffract_training"):
        _train(model, 12, again.step, start=4)
        again.close()
    assert again.analysed == [12] and list(again.blocked) == [12]
    assert not [r for r in caplog.records if r.name == "diffract_training"]
    with Session("local", path=str(tmp_path / "run")) as s:
        assert sorted(s.models.steps()[m]["step"] for m in s.model_ids) == [4, 8, 12]
