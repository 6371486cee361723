"""``diffract analyze`` and ``diffract track`` on s3:// URLs, against the loopback S3
server of conftest.py: a run tracked from an S3 glob as from its files on disk, a new
checkpoint added alone, a rewritten one refused, and each kind of bad input one line and
exit 2 with no store left claiming a checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from diffract import Session
from diffract.cli import main

METRICS = "alpha,stable_rank"


def _checkpoint(path: Path, step: int) -> Path:
    rng = np.random.default_rng(step)
    path.mkdir(parents=True)
    save_file({f"layers.{i}.weight": (rng.standard_normal((96, 64)) * (1 + step / 500)
                                      ).astype(np.float32) for i in range(3)},
              str(path / "model.safetensors"))
    return path


def _run(s3, tmp_path: Path, prefix: str, steps) -> Path:
    local = tmp_path / prefix
    for step in steps:
        s3.put_tree(_checkpoint(local / f"step-{step}", step), f"{prefix}/step-{step}")
    return local


def _trajectory(store: Path) -> dict[str, dict[str, float]]:
    with Session(profile="local", path=str(store)) as session:
        return {m: {p: r["stable_rank"] for p, r in
                    session.results.export_metrics("stable_rank")[m].items()}
                for m in session.models.ordered()}


def test_track_from_an_s3_glob_as_from_disk_then_a_new_and_a_rewritten_checkpoint(
        s3, tmp_path, capsys):
    local = _run(s3, tmp_path, "cli-run", (100, 200, 300))
    from_s3, from_disk = tmp_path / "s3.diffract", tmp_path / "disk.diffract"
    assert main(["track", "s3://runs/cli-run/step-*", "--store", str(from_s3), "--metrics",
                 METRICS, "-q"]) == 0
    assert main(["track", str(local / "step-*"), "--store", str(from_disk), "--metrics",
                 METRICS, "-q"]) == 0
    assert "added 3 checkpoint(s): step-100, step-200, step-300" in capsys.readouterr().out
    assert _trajectory(from_s3) == _trajectory(from_disk)

    s3.put_tree(_checkpoint(local / "step-400", 400), "cli-run/step-400")
    assert main(["track", "s3://runs/cli-run/step-*", "--store", str(from_s3), "--metrics",
                 METRICS, "-q"]) == 0
    assert "added 1 checkpoint(s): step-400" in capsys.readouterr().out

    save_file({"layers.0.weight": np.zeros((96, 64), np.float32)},
              str(tmp_path / "other.safetensors"))
    s3.put_tree(tmp_path / "other.safetensors", "cli-run/step-200/model.safetensors")
    assert main(["track", "s3://runs/cli-run/step-*", "--store", str(from_s3), "--metrics",
                 METRICS, "-q"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint 'step-200' changed in object storage since it was tracked" in err
    assert "s3://runs/cli-run/step-200/model.safetensors: it" in err


def test_track_with_its_alignment_fetches_each_tensor_once(s3, tmp_path):
    """The metrics read the weights (the esd) and the alignment reads them again (the
    svd): run in one step, one read serves both, so from object storage every byte of
    every checkpoint is fetched once (it was fetched twice: 2.00x)."""
    local = _run(s3, tmp_path, "once-run", (100, 200, 300))
    s3.reset()
    store = tmp_path / "once.diffract"
    assert main(["track", "s3://runs/once-run/step-*", "--store", str(store), "-q"]) == 0
    whole = sum((local / f"step-{s}" / "model.safetensors").stat().st_size
                for s in (100, 200, 300))  # its header and every tensor
    assert whole <= s3.object_bytes <= 1.05 * whole
    with Session(profile="local", path=str(store)) as session:
        pairs = {r["models"] for r in session.results.export_aggregates(
            "l_subspace_overlap", export_format="list")}
        # the alignment (against the previous and the first) was computed from that read
        assert pairs == {"step-100,step-200", "step-200,step-300", "step-100,step-300"}


def test_track_with_heads_fetches_each_tensor_once(s3, tmp_path, monkeypatch):
    """With --views heads the heads' fields, their parents' and both sides of each head's
    change come from one read of each projection too (the parents kept for their views
    limited to one: a small run's would all be kept, a large one's not)."""
    monkeypatch.setattr("diffract.core.models.RECENT_BYTES", 64 * 64 * 4)
    local = tmp_path / "heads-run"
    for step in (10, 20, 30):
        folder = local / f"step-{step}"
        folder.mkdir(parents=True)
        rng = np.random.default_rng(step)
        save_file({f"model.layers.0.self_attn.{p}_proj.weight":
                   rng.standard_normal((64, 64)).astype(np.float32) for p in "qkvo"},
                  str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(
            {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4}))
        s3.put_tree(folder, f"heads-run/step-{step}")
    s3.reset()
    store = tmp_path / "heads.diffract"
    assert main(["track", "s3://runs/heads-run/step-*", "--store", str(store), "--views",
                 "heads", "-q"]) == 0
    whole = sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
    assert whole <= s3.object_bytes <= 1.05 * whole
    with Session(profile="local", path=str(store)) as session:
        moved = session.results.export_aggregates("r_subspace_overlap", export_format="list")
        assert len(moved) == 3 * 4 * 4  # three pairs, four projections of four heads
        assert session.results.export_metrics("pl_alpha_hill")["step-30"]


def test_analyze_a_folder_with_the_endpoint_as_a_storage_option(s3, tmp_path):
    _run(s3, tmp_path, "opt-run", (5,))
    import socket

    with socket.socket() as sock:  # the environment names a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{sock.getsockname()[1]}"}
    done = subprocess.run([sys.executable, "-m", "diffract.cli", "analyze",
                           "s3://runs/opt-run/step-5/", "--format", "json", "--metrics",
                           "stable_rank", "-q", "--storage-option", f"endpoint_url={s3.endpoint}"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert {r["param"] for r in rows} == {f"layers.{i}.weight" for i in range(3)}


@pytest.mark.parametrize("case", ["glob matches nothing", "no such bucket",
                                  "unreachable endpoint", "no credentials"])
def test_bad_input_is_one_line_exit_2_and_no_store(s3, tmp_path, case):
    _run(s3, tmp_path, "bad-run", (1,))
    env = dict(os.environ)
    pattern = "s3://runs/bad-run/step-*"
    if case == "glob matches nothing":
        pattern = "s3://runs/bad-run/ckpt-*"
    elif case == "no such bucket":
        pattern = "s3://no-such-bucket/run/step-*"
    elif case == "unreachable endpoint":
        import socket

        with socket.socket() as sock:  # a port nothing listens on
            sock.bind(("127.0.0.1", 0))
            env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{sock.getsockname()[1]}"
    else:
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            env.pop(key, None)
        env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
                   AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true")
    store = tmp_path / "run.diffract"
    done = subprocess.run([sys.executable, "-m", "diffract.cli", "track", pattern, "--store",
                           str(store), "--metrics", METRICS, "-q"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diffract track: error: "), done.stderr
    said = {"glob matches nothing": "matches no checkpoint in object storage",
            "no such bucket": "no such object, prefix or bucket",
            "unreachable endpoint": "cannot reach the object store",
            "no credentials": "give credentials where its library reads them"}[case]
    assert said in lines[0]
    assert not store.exists()


def test_storage_options_nest_parse_values_and_refuse_what_is_malformed():
    import argparse

    from diffract_report._inputs import UsageError, storage_options

    def parsed(*given):
        return storage_options(argparse.Namespace(storage_options=list(given)))

    assert parsed("endpoint_url=http://h:9000", "anon=true", "client_kwargs.region_name=eu",
                  "client_kwargs.verify=false", "max_concurrency=4") == {
        "endpoint_url": "http://h:9000", "anon": True, "max_concurrency": 4,
        "client_kwargs": {"region_name": "eu", "verify": False}}
    for bad in ("endpoint_url", "=x", "a..b=1"):
        with pytest.raises(UsageError, match="expected KEY=VALUE"):
            parsed(bad)
    with pytest.raises(UsageError, match="'a' is given a value and options both"):
        parsed("a=1", "a.b=2")


@pytest.mark.parametrize("option", [
    "client_kwargs.aws_secret_access_key=s3cr3t-value",
    "config_kwargs.proxies.https=http://user:s3cr3t-value@proxy:3128",
    "connection_string=AccountKey=s3cr3t-value",
])
def test_a_credential_in_a_storage_option_at_any_depth_is_refused_unseen(s3, tmp_path,
                                                                         option):
    """exit 2 with one line naming the option; its value appears in no output, and no
    store is written."""
    _run(s3, tmp_path, "secret-run", (5,))
    store = tmp_path / "s.diffract"
    done = subprocess.run([sys.executable, "-m", "diffract.cli", "analyze",
                           "s3://runs/secret-run/step-5/", "--store", str(store), "-q",
                           "--storage-option", f"endpoint_url={s3.endpoint}",
                           "--storage-option", option],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    assert option.split("=")[0] in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "s3cr3t" not in done.stdout + done.stderr
    assert not store.exists() or b"s3cr3t" not in b"".join(
        f.read_bytes() for f in store.rglob("*") if f.is_file())


def test_option_values_nested_too_deep_are_a_usage_error_not_a_traceback():
    import argparse

    from diffract_report._inputs import UsageError, parse_setting, storage_options

    deep = "[" * 100_000
    with pytest.raises(UsageError, match="nests too deeply"):
        storage_options(argparse.Namespace(storage_options=[f"retries={deep}"]))
    with pytest.raises(UsageError, match="nests too deeply"):
        parse_setting(f"power_law_fit.min_tail={deep}")


def test_a_server_that_never_answers_is_given_up_naming_the_endpoint(s3, tmp_path):
    """A listener that accepts the connection and never answers: the command ends with
    one line naming the endpoint once DIFFRACT_REMOTE_TIMEOUT passes (each request given
    up, retried once), instead of waiting without limit."""
    from tests.resources.silent import silent_listener

    with silent_listener() as (address, held):
        endpoint = f"http://{address}"
        done = subprocess.run(
            [sys.executable, "-m", "diffract.cli", "analyze", "s3://runs/x/m.safetensors",
             "-q", "--storage-option", f"endpoint_url={endpoint}"],
            env={**os.environ, "DIFFRACT_REMOTE_TIMEOUT": "1"}, capture_output=True,
            text=True, timeout=300)
        connected = len(held)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and endpoint in done.stderr
    assert connected  # it did connect: the limit, not a refused connection, ended it
