"""Every code block of README.md and docs/ runs (issue 33 item 6), in a folder holding the
files the blocks name (small checkpoints with BERT's parameter names, a training run, an
adapter, a training checkpoint with an EMA copy, ONNX and Flax files). Each Python block
runs alone in a fresh interpreter, as a reader would paste it, unless its first line says
``# continues the block above`` (then after that one; a block that starts
``# package/module.py`` is that file: written, then imported), and prints no traceback
and no warning about a missing ``__main__`` guard; shell blocks run line by line with the
installed ``diffract``. A block that must not run says so on
the line before it, with the reason: ``<!-- docs-test: skip: REASON -->``; a block that
continues one not shown names its setup: ``<!-- docs-test: setup: CODE -->``."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNS = {"python", "bash", "sh", ""}  # the languages that are code to run
FENCE = re.compile(r"(?:^<!-- docs-test: (skip|setup): (.+?) -->\n)?^```(\w*)\n(.*?)^```",
                   re.M | re.S)


def blocks(path: Path) -> list[tuple[int, str, str, str, str]]:
    """(line, language, marker, marker text, code) of every fenced block of ``path``."""
    text = path.read_text()
    return [(text[:m.start()].count("\n") + 1 + bool(m.group(1)), m.group(3),
             m.group(1) or "", m.group(2) or "", m.group(4)) for m in FENCE.finditer(text)]


def test_every_block_that_is_not_run_says_why():
    seen = 0
    for path in FILES:
        for line, lang, marker, why, _ in blocks(path):
            seen += lang in RUNS
            if marker == "skip":
                assert len(why) > 15, f"{path.name}:{line}: say why it does not run"
    assert seen >= 20


# -- the folder the blocks run in ---------------------------------------------------------------
def _bert(rng: np.random.Generator, layers: int = 2, width: int = 64) -> dict[str, np.ndarray]:
    def heavy(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_t(3, (rows, cols)) / np.sqrt(cols)).astype(np.float32)

    out = {"embeddings.word_embeddings.weight": heavy(300, width)}
    for i in range(layers):
        pre = f"encoder.layer.{i}."
        for leaf in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            out[pre + leaf + ".weight"] = heavy(width, width)
        out[pre + "intermediate.dense.weight"] = heavy(4 * width, width)
        out[pre + "output.dense.weight"] = heavy(width, 4 * width)
        out[pre + "output.dense.bias"] = np.zeros(width, np.float32)
    return out


def _hf_dir(folder: Path, weights: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "model_type": "bert", "hidden_size": 64, "num_attention_heads": 4,
        "num_hidden_layers": 2, "intermediate_size": 256}))


def _dcp_dir(folder: Path, weights: dict[str, np.ndarray]) -> None:
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # one process, no process group: DCP says so
        warnings.simplefilter("ignore")
        dcp.save({"model": {k: torch.from_numpy(v.copy()) for k, v in weights.items()},
                  "train_state": {"step": 1}}, checkpoint_id=str(folder))


def _hf_cache(cache: Path, repo_id: str, weights: dict[str, np.ndarray]) -> None:
    """``repo_id`` in a cache laid out as huggingface_hub lays it (snapshot links)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    _hf_dir(repo / "blobs" / "files", weights)
    snapshot = repo / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    for name in ("model.safetensors", "config.json"):
        (snapshot / name).symlink_to(Path("../../blobs/files") / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    import torch
    from safetensors.numpy import save_file

    here = tmp_path_factory.mktemp("docs")
    rng = np.random.default_rng(0)
    base = _bert(rng)
    walk = dict(base)
    save_file(base, str(here / "model.safetensors"))
    for name in ("ckpt", "big", "base", "checkpoints/step-1000"):
        _hf_dir(here / name, base)
    for step in (100, 200, 300, 400, 500):  # a training run, and three named steps
        walk = {k: v + 0.05 * rng.standard_normal(v.shape).astype(np.float32) / 8
                for k, v in walk.items()}
        _hf_dir(here / "runs" / "a" / f"checkpoint-{step}", walk)
        if step <= 300:
            _hf_dir(here / f"step{step * 10}", walk)
        if step <= 300:  # the same run as torchtitan saves it (torch.distributed.checkpoint)
            _dcp_dir(here / "runs" / "titan" / f"step-{step}", walk)
    _hf_cache(here / "hf-cache", "Qwen/Qwen3-0.6B", base)
    _hf_dir(here / "tuned", walk)
    _hf_dir(here / "finetuned", walk)
    q = "encoder.layer.0.attention.self.query"
    adapter = {f"base_model.model.{q}.lora_A.weight": rng.standard_normal((4, 64)),
               f"base_model.model.{q}.lora_B.weight": rng.standard_normal((64, 4))}
    (here / "adapter").mkdir()
    save_file({k: v.astype(np.float32) for k, v in adapter.items()},
              str(here / "adapter" / "adapter_model.safetensors"))
    (here / "adapter" / "adapter_config.json").write_text(json.dumps({"lora_alpha": 8, "r": 4}))
    (here / "train").mkdir()
    state = {k: torch.from_numpy(v.copy()) for k, v in base.items()}
    torch.save({"model": state, "ema": state, "step": 7}, here / "train" / "ckpt.pt")
    sys.path.insert(0, str(ROOT / "tests" / "formats"))
    try:
        import test_more_formats as formats

        onnx_path, _ = formats._onnx_model(here)
        onnx_path.rename(here / "model.onnx")
        formats._flax_file(here / "flax_model.msgpack")
        formats._gguf_file(here / "llama-7b-Q4_K_M.gguf")
        formats._keras_files(here)
        (here / "m.keras").rename(here / "model.keras")
    finally:
        sys.path.remove(str(ROOT / "tests" / "formats"))
    return here


def _env(folder: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "MPLBACKEND": "Agg", "DIFFRACT_STRICT_PLUGINS": "",
            "HF_HUB_CACHE": str(folder / "hf-cache")}


def _shell_lines(code: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(shlex.join(words))
    return out


def _cases() -> list:
    out = []
    for path in FILES:
        found = [b for b in blocks(path) if b[1] in RUNS and b[2] != "skip"]
        if found:
            out.append(pytest.param(path, found, id=path.relative_to(ROOT).as_posix()))
    return out


#: The first line of a Python block that continues the one before it (which then runs
#: first, with whatever that one continues): ``# continues the block above``.
CONTINUES = re.compile(r"# continues the block above\b")
#: What a block may not print: a warning a reader would take for a problem.
NOISE = ("if __name__", "Traceback")


def _run_python(path: Path, line: int, program: list[str], folder: Path) -> list[str]:
    """What went wrong running ``program`` (empty: nothing)."""
    script = folder / "docs_block.py"  # a file, as a reader saves it (a pool's workers
    script.write_text("\n".join(program))  # import it: the __main__ guard matters there)
    run = subprocess.run([sys.executable, script.name], cwd=folder,
                         env=_env(folder), capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        return [f"{path.name}:{line}, run as a reader runs it:\n{run.stdout[-1000:]}\n"
                f"{run.stderr[-3000:]}"]
    noise = [n for n in NOISE if n in run.stderr]
    return [f"{path.name}:{line} prints {noise}:\n{run.stderr[-3000:]}"] if noise else []


@pytest.mark.parametrize(("path", "found"), _cases())
def test_the_blocks_run(path, found, folder):
    """Each Python block runs alone, in a fresh interpreter, as a reader who pastes it
    runs it, unless its first line says it continues the block above; shell blocks
    line by line."""
    chain: list[str] = []
    problems: list[str] = []
    for line, lang, marker, setup, code in found:
        source = re.match(r"# ([\w/]+)\.py\n", code)
        if lang == "python" and source:  # a module of a package the text builds: write it
            target = folder / (source.group(1) + ".py")
            target.parent.mkdir(parents=True, exist_ok=True)
            (target.parent / "__init__.py").touch()
            target.write_text(code)
            problems += _run_python(path, line, [f"import {source.group(1).replace('/', '.')}"],
                                    folder)
            continue
        if lang == "python":
            here = ([f"# setup of the block at line {line}\n{setup}\n"]
                    if marker == "setup" else []) + [f"# {path.name}:{line}\n{code}"]
            chain = (chain if CONTINUES.match(code) else []) + here
            problems += _run_python(path, line, chain, folder)
            continue
        for command in _shell_lines(code):
            if command.startswith("./dev "):
                continue  # what CI itself runs (.ci/run), in a clone of its own
            run = subprocess.run(command, shell=True, cwd=folder, env=_env(folder),
                                 capture_output=True, text=True, timeout=900)
            assert run.returncode == 0, (f"{path.name}:{line}: {command}\n"
                                         f"{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
    assert not problems, "\n\n".join(problems)

