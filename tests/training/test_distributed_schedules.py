"""The alpha-driven schedules under torch.distributed, two gloo processes on the CPU: every
rank's param groups the same at every step (DDP, and FSDP2's DTensor shards), the factors
those of one process's schedule on the same weights, a resume on two ranks the same as an
uninterrupted run, and each rank analysing its own share of the matrices. Bad input (a
schedule on one rank only, different models, a process group torn down, a rank whose
analysis never ends): a clear error on every rank, no hang, nothing stray in the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors.torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from diffract import Session  # noqa: E402
from tests.training.ranks import free_port  # noqa: E402

_RANK = textwrap.dedent("""
    import json, os, sys, threading
    import torch, torch.distributed as dist
    from safetensors.torch import save_file, load_file
    sys.path.insert(0, {tests!r})
    from training.test_monitor import _net
    from diffract_training import LayerwiseLR, Monitor, TempBalance
    from diffract.errors import DiffractError

    kind, rank, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    start = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
                            world_size=2)
    record = {{"lrs": {{}}, "factors": {{}}, "error": None, "alphas": {{}}}}

    def finish(code=0):
        with open(f"{{out}}/rank{{rank}}.json", "w") as fh:
            json.dump(record, fh)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    model = _net(1 if kind == "two-models" and rank == 1 else 0)
    if kind == "two-models":
        model = torch.nn.Sequential(*list(model)[:3]) if rank == 1 else model
    if kind.startswith("fsdp2"):
        from training.ranks import fsdp2
        wrapped = watched = fsdp2(model)
    elif kind == "two-models":
        wrapped = watched = model
    elif kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        wrapped = watched = FSDP(model, device_id=torch.device("cpu"))
    else:
        wrapped, watched = torch.nn.parallel.DistributedDataParallel(model), model
    if start:  # a resumed run: the weights, optimizer and schedule of step `start`
        state = torch.load(f"{{out}}/resume-{{rank}}.pt", weights_only=True)
        watched.load_state_dict(state["model"])
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
    options = dict(every=2, store=out + "/run.diffract" if kind in ("ddp", "torn") else None,
                   background=kind not in ("ddp-save", "ddp-resume", "fsdp2", "two-models"))
    if kind.startswith("llr"):
        schedule = LayerwiseLR(every=2, ramp=2, embed_name="none", head_name="4",
                               min_eigenvalues=0, background=True)
    else:
        schedule = TempBalance(remove_first=False, remove_last=False, min_eigenvalues=0,
                               **options)
    try:
        if kind == "one-rank" and rank == 1:
            pass  # rank 1 trains without the schedule
        elif kind == "two-models":
            Monitor(watched, every=2, background=False)
        else:
            schedule.attach(watched, opt, start)
        if start:
            opt.load_state_dict(state["opt"])
            schedule.load_state_dict(state["schedule"])
        if kind == "hung":  # the deadline short from now on (attach's analysis had the
            schedule.monitor._ranks.timeout = 2.0  # default, however busy the machine)
        if kind == "hung" and rank == 1:  # this rank's analyses never end
            stuck = threading.Event()
            schedule.monitor._analyse_share = lambda step, snap: stuck.wait()
        if kind == "fails" and rank == 1:
            def broken(step, snap):
                schedule.monitor._share = {{"step": step, "error": "RuntimeError: planted"}}
            schedule.monitor._analyse_share = broken
        gen = torch.Generator().manual_seed(rank)
        for _ in range(start):
            torch.randn(8, 160, generator=gen)
        for step in range(start + 1, 9):
            loss = wrapped(torch.randn(8, 160, generator=gen)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if kind == "torn" and step == 3 and rank == 1:
                dist.destroy_process_group()
            if step % 2 == 0:  # the whole weights, as a checkpoint of this step
                whole = {{n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
                         .clone() for n, p in watched.named_parameters()}}
                if rank == 0:
                    save_file(whole, f"{{out}}/s{{step}}.safetensors")
            schedule.step(step)
            schedule.monitor.wait() if kind == "llr-wait" else None
            record["lrs"][step] = [g["lr"] for g in opt.param_groups]
            record["factors"][step] = schedule.factors
            record["alphas"][step] = {{m: list(v) for m, v in schedule.alphas.items()}}
            if kind == "ddp-save" and step == 4:
                torch.save({{"model": watched.state_dict(), "opt": opt.state_dict(),
                            "schedule": schedule.state_dict()}}, f"{{out}}/resume-{{rank}}.pt")
        record["share"] = schedule.monitor._mine
        record["skipped"] = schedule.monitor.skipped
        schedule.close()
        dist.barrier()
    except DiffractError as exc:
        record["error"] = f"{{type(exc).__name__}}: {{exc}}"
        finish(3)
    except Exception as exc:
        record["error"] = f"{{type(exc).__name__}}: {{exc}}"
        finish(4)
    dist.destroy_process_group()
    finish()
""")


def _run(tmp_path: Path, kind: str, *extra: str, timeout: str | None = None) -> list[dict]:
    script = tmp_path / "rank.py"
    script.write_text(_RANK.format(tests=str(Path(__file__).parents[1])))
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k != "DIFFRACT_DIST_TIMEOUT"}
    env["PYTHONFAULTHANDLER"] = "1"
    if timeout is not None:  # the one wait a case is about (a rank that never attaches)
        env["DIFFRACT_DIST_TIMEOUT"] = timeout
    for r in (0, 1):
        (tmp_path / f"rank{r}.json").unlink(missing_ok=True)
    ranks = [subprocess.Popen([sys.executable, str(script), kind, str(r), port,
                               str(tmp_path), *extra], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in (0, 1)]
    out = []
    for r, proc in enumerate(ranks):
        err = proc.communicate(timeout=600)[1]
        path = tmp_path / f"rank{r}.json"
        record = json.loads(path.read_text()) if path.exists() else {}
        out.append({**record, "rc": proc.returncode, "stderr": err})
    return out


def _single_process_factors(path: Path, **options) -> dict[str, float]:
    """The factors one process's TempBalance sets on the weights of ``path``."""
    from safetensors.torch import load_file

    from diffract_training import TempBalance
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from training.test_monitor import _net

    model = _net()
    model.load_state_dict(load_file(path))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with TempBalance(model, opt, every=2, remove_first=False, remove_last=False,
                     min_eigenvalues=0, background=False, **options) as schedule:
        return schedule.factors


@pytest.mark.parametrize("kind", ["ddp", "fsdp2", "llr"])
def test_every_rank_steps_the_same_factors_as_one_process(tmp_path, kind):
    zero, one = _run(tmp_path, kind)
    assert zero["rc"] == one["rc"] == 0, zero["stderr"] + one["stderr"]
    # The same param groups on both ranks at every step, and moving (not all at 1x).
    assert zero["lrs"] == one["lrs"] and len(zero["lrs"]) == 8
    assert len({tuple(v) for v in zero["lrs"].values()}) > 1
    # Each rank analysed its own share of the three matrices (by size: 0.weight, the
    # largest, alone on rank 0).
    assert zero["share"] == ["0.weight"]
    assert one["share"] == (["2.weight"] if kind == "llr" else ["2.weight", "4.weight"])
    if kind == "llr":
        return
    # Wherever an analysed step's alphas are in force, the factors of one process's
    # schedule on the weights saved at that step (in the background, a later step).
    compared = set()
    for now, alphas in zero["alphas"].items():
        (analysed,) = {s for s, _ in alphas.values()}
        if analysed:
            want = _single_process_factors(tmp_path / f"s{analysed}.safetensors")
            assert zero["factors"][now] == want, (now, analysed)
            compared.add(analysed)
    # inline every cadence point; in the background a busy machine skips some
    assert compared == {2, 4, 6, 8} if kind == "fsdp2" else compared
    if kind == "ddp":  # the store: each analysed step once, the alphas of one process
        with Session("local", path=str(tmp_path / "run.diffract")) as s:
            stored = s.results.export_metrics("pl_alpha_hill")
        steps = sorted(int(m.split("-")[1]) for m in stored)
        assert steps[0] == 0 and steps == sorted(set(steps))
        for step in steps[1:]:
            with Session() as s:
                s.models.add(tmp_path / f"s{step}.safetensors", "ck")
                s.compute.apply("pl_alpha_hill", errors="record")
                want = s.results.export_metrics("pl_alpha_hill")["ck"]
            assert stored[f"step-{step}"] == want


def test_a_resume_on_two_ranks_sets_the_factors_of_an_uninterrupted_run(tmp_path):
    whole = _run(tmp_path, "ddp-save")
    assert all(r["rc"] == 0 for r in whole), whole[0]["stderr"] + whole[1]["stderr"]
    resumed = _run(tmp_path, "ddp-resume", "4")
    assert all(r["rc"] == 0 for r in resumed), resumed[0]["stderr"] + resumed[1]["stderr"]
    for r in (0, 1):
        for step in ("5", "6", "7", "8"):
            assert resumed[r]["lrs"][step] == whole[r]["lrs"][step], step


def test_a_schedule_on_one_rank_only_is_an_error_not_a_hang(tmp_path):
    zero, one = _run(tmp_path, "one-rank", timeout="3")
    assert zero["rc"] == 3 and "rank(s) [1] of 2 did not attach" in zero["error"]
    assert one["rc"] != 0  # its next collective fails once rank 0 has gone


def test_different_models_on_the_ranks_are_refused_on_every_rank(tmp_path):
    zero, one = _run(tmp_path, "two-models")
    for r in (zero, one):
        assert r["rc"] == 3 and "attached different monitors" in r["error"]
        assert "matrices" in r["error"]


def test_a_torn_down_group_is_an_error_on_every_rank_and_nothing_stray_is_stored(tmp_path):
    zero, one = _run(tmp_path, "torn")
    assert one["rc"] == 3 and "process group was destroyed on rank 1" in one["error"]
    assert zero["rc"] == 3 and "torch.distributed failed on rank 0" in zero["error"]
    with Session("local", path=str(tmp_path / "run.diffract")) as s:
        assert s.model_ids == ["step-0"]  # step 2 was in flight when the group went


@pytest.mark.parametrize("kind", ["hung", "fails"])
def test_a_rank_whose_analysis_fails_holds_no_one_and_factors_stay(tmp_path, kind):
    zero, one = _run(tmp_path, kind)
    assert zero["rc"] == one["rc"] == 0, zero["stderr"] + one["stderr"]
    assert zero["lrs"] == one["lrs"]
    # The first factors (step 0, before the planted failure) stay for the whole run.
    assert all(v == zero["lrs"]["1"] for v in zero["lrs"].values())
    assert len(set(zero["lrs"]["1"])) > 1
    said = "did not finish on every rank" if kind == "hung" else "rank 1: RuntimeError: planted"
    assert said in zero["stderr"] and said in one["stderr"]


def test_a_schedule_on_fsdp1_is_refused_with_what_to_use(tmp_path):
    for r in _run(tmp_path, "fsdp1"):
        assert r["rc"] == 3 and "FSDP2's fully_shard" in r["error"]
