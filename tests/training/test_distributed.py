"""diffractml-training under torch.distributed, two gloo processes on the CPU: DDP's
replicated parameters and FSDP2's DTensor shards (gathered one at a time, every rank
taking part), each rank analysing its share of the matrices, give the values of an
analysis of the whole weights saved at the same step, per-model fields included; rank 0
alone logs and writes them; the other rank writes and logs nothing and does not contend
for the store's lock."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors.torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from diffract import Session  # noqa: E402
from tests.training.ranks import free_port  # noqa: E402

METRICS = ("pl_alpha", "stable_rank", "log_norm", "spectral_norm")

_RANK = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    from safetensors.torch import save_file
    sys.path.insert(0, {tests!r})
    from training.test_monitor import _net
    from diffract_training import Monitor

    kind, rank, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    logged = {{}}
    if kind == "ddp-early":  # a callback built before the group, no launcher's RANK
        os.environ.pop("RANK", None)
        os.environ.pop("LOCAL_RANK", None)
        early = Monitor(None, every=2, metrics={metrics!r}, background=False,
                        log=lambda values, step: logged.setdefault(step, values))
    else:
        os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
                            world_size=2)
    model = _net()
    if kind.startswith("ddp"):
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        watched = model
    elif kind.startswith("fsdp1"):  # FSDP1: flat parameters, one unit per Linear
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        wrapped = watched = FSDP(model, device_id=torch.device("cpu"),
                                 use_orig_params=kind == "fsdp1-orig",
                                 auto_wrap_policy=ModuleWrapPolicy({{torch.nn.Linear}}))
    else:
        from training.ranks import fsdp2
        wrapped = watched = fsdp2(model)
    if kind == "ddp-early":
        monitor = early
        monitor.attach(watched)
    else:
        monitor = Monitor(watched, every=2, store=out + "/run.diffract",
                          metrics={metrics!r} + ({model_level!r} if kind == "ddp-model" else ()),
                          log=lambda values, step: logged.setdefault(step, values),
                          background=kind == "fsdp2-background")
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, 5):
        loss = wrapped(torch.randn(8, 160, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 2 == 0 and kind.startswith("fsdp1"):  # the whole weights, FSDP1's way
            with FSDP.summon_full_params(wrapped, writeback=False):
                whole = {{n: p.detach().clone() for n, p in wrapped.named_parameters()}}
        elif step % 2 == 0:  # the whole weights, as a checkpoint of this step
            whole = {{n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                     for n, p in watched.named_parameters()}}
        if step % 2 == 0:
            if rank == 0:
                save_file(whole, f"{{out}}/s{{step}}.safetensors")
        monitor.step(step)
    monitor.close()
    with open(f"{{out}}/rank{{rank}}.json", "w") as fh:
        json.dump({{"logged": {{str(k): v for k, v in logged.items()}},
                   "sharded": monitor._sharded, "writer": monitor.writer,
                   "share": monitor._mine}}, fh)
    # Both ranks done before the group goes; then leave without the interpreter's
    # teardown, where torch's C++ threads (gloo, FSDP2) sometimes abort the process
    # ("terminate called without an active exception") after everything has passed.
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
""")


def _model_level(matrices, step):
    with Session() as s:
        s.models.add(matrices, f"step-{step}")
        s.compute.apply(*METRICS, *MODEL_LEVEL, errors="record")
        return s.results.export_aggregates(*MODEL_LEVEL)


def _as_a_monitors_worker(call):
    """``call()`` in a thread of its own with one OpenMP thread, as a monitor's worker
    analyses (torch's reductions, frob_norm's, sum in another order on more threads)."""
    import threading

    from diffract.plugins import one_openmp_thread

    out = []
    thread = threading.Thread(target=lambda: (one_openmp_thread(), out.append(call())))
    thread.start()
    thread.join()
    return out[0]


MODEL_LEVEL = ("model_log_norm", "model_pl_alpha_norm", "param_norm", "total_numel",
               "max_row_norm", "log_prod_spectral_norm")


@pytest.mark.parametrize("kind", ["ddp", "fsdp2", "fsdp2-background", "ddp-early",
                                  "ddp-model", "fsdp1", "fsdp1-orig"])
def test_two_ranks_log_once_the_values_of_the_whole_weights(tmp_path, kind):
    script = tmp_path / "rank.py"
    script.write_text(_RANK.format(tests=str(Path(__file__).parents[1]), metrics=METRICS,
                                   model_level=MODEL_LEVEL))
    port = str(free_port())
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}  # a crash shows every thread's stack
    ranks = [subprocess.Popen([sys.executable, str(script), kind, str(r), port, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in (0, 1)]
    errs = [proc.communicate(timeout=600)[1] for proc in ranks]
    for proc in ranks:
        assert proc.returncode == 0, "\n--- the other rank ---\n".join(errs)
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert zero["writer"] and not one["writer"] and one["logged"] == {}
    # Each rank analysed its share (the largest matrix alone on rank 0).
    assert zero["share"] == ["0.weight"] and one["share"] == ["2.weight", "4.weight"]
    # In the background, step 4 may come while step 2 is analysed: skipped on both ranks
    # alike (rank 0 decides), so neither waits in a gather the other never makes.
    steps = [int(k) for k in zero["logged"]]
    assert steps == [2, 4] or (kind == "fsdp2-background" and steps == [2]), errs
    want_sharded = ["0.weight", "2.weight", "4.weight"] if kind.startswith("fsdp") else []
    assert zero["sharded"] == one["sharded"] == want_sharded
    stored = {}
    if kind != "ddp-early":  # that one logs only (on rank 0 alone)
        with Session("local", path=str(tmp_path / "run.diffract")) as s:
            stored = s.results.export_metrics(*METRICS)
            assert sorted(s.models.steps()[m]["step"] for m in s.model_ids) == steps
    for step in steps:
        with Session() as s:
            s.models.add(tmp_path / f"s{step}.safetensors", "ck")
            s.compute.apply(*METRICS, errors="record")
            want = s.results.export_metrics(*METRICS)["ck"]
        assert set(want) == {"0.weight", "2.weight", "4.weight"}
        for param, row in want.items():
            for field in METRICS:
                got = stored[f"step-{step}"][param][field] if stored else row[field]
                assert got == row[field] or (np.isnan(got) and np.isnan(row[field]))
                if np.isfinite(row[field]):
                    assert zero["logged"][str(step)][f"diffract/{field}/{param}"] == row[field]
        if kind == "ddp-model":  # per-model fields from the gathered shares, as one process
            from safetensors.torch import load_file

            matrices = {n: t for n, t in load_file(tmp_path / f"s{step}.safetensors").items()
                        if t.dim() == 2}  # the monitor's model: its analysed matrices
            want = _as_a_monitors_worker(functools.partial(_model_level, matrices, step))
            with Session("local", path=str(tmp_path / "run.diffract")) as s:
                got = s.filter(model_ids=[f"step-{step}"]).results.export_aggregates(
                    *MODEL_LEVEL)
            assert len(want) == len(MODEL_LEVEL) and got == want
