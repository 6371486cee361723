"""torch.distributed.checkpoint folders (issue 35 item 1): written with
``torch.distributed.checkpoint.save`` by one process and by two gloo processes saving an
FSDP2-sharded model, read back with the model's own names, shapes and values; the
metadata read without running anything it asks for; nothing read outside the folder;
a view reads only the chunks holding its rows; a seeded fuzz of metadata and shards."""

from __future__ import annotations

import os
import pickle
import re
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from diffract import Session  # noqa: E402
from diffract.errors import ModelSourceError  # noqa: E402
from diffract_formats.dcp_reader import DcpReader  # noqa: E402


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 16, bias=False))


def _save(state: dict, folder: Path) -> Path:
    with warnings.catch_warnings():  # one process, no process group: DCP says so
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(folder))
    return folder


def _trained(folder: Path, wrap=lambda sd: {"model": sd}, dtype=torch.float32):
    """A model after one AdamW step, saved as a training stack saves it (``wrap`` puts
    its state dict where the stack does); returns the model's own state dict."""
    model = _net().to(dtype)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 24, dtype=dtype)).sum().backward()
    opt.step()
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _save({**wrap(model.state_dict()), "optim": opt.state_dict(), "step": 7}, folder)
    return sd


def _read(path: Path, **options) -> dict[str, torch.Tensor]:
    reader = DcpReader(str(path), **options)
    return {e.name: reader.read(e.name) for e in reader.entries()}


class TestOneProcess:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_names_shapes_and_values_are_the_models(self, tmp_path, dtype):
        want = _trained(tmp_path / "ck", dtype=dtype)
        got = _read(tmp_path / "ck")
        assert sorted(got) == sorted(want)  # optimizer state and the step left out
        for name, value in want.items():
            assert got[name].dtype == dtype and torch.equal(got[name], value)
        with Session() as s:
            s.models.add(tmp_path / "ck", "m")
            assert {p.name: (p.shape, p.dtype) for p in s.models.params("m")} == {
                n: (tuple(v.shape), str(dtype).removeprefix("torch.")) for n, v in want.items()}
            assert s.models.list()[0]["source"] == str(tmp_path / "ck")
            np.testing.assert_array_equal(s.store.load_weights("m", "2.weight"),
                                          want["2.weight"].float().numpy())

    @pytest.mark.parametrize(("wrap", "options"), [
        (lambda sd: {"app": {"model": sd}}, {}),             # app.model.
        (lambda sd: {"module": sd}, {}),                     # module.
        (lambda sd: dict(sd), {}),                           # torchtitan: the keys bare
        (lambda sd: {"net": sd}, {"prefix": "net."}),        # named by the option
        (lambda sd: {"app": {"model": sd, "optimizer": {"lr": torch.ones(1)}}}, {}),
    ])
    def test_the_stacks_prefixes(self, tmp_path, wrap, options):
        want = _trained(tmp_path / "ck", wrap=wrap)
        got = _read(tmp_path / "ck", **options)
        assert sorted(got) == sorted(want)
        assert all(torch.equal(got[n], v) for n, v in want.items())

    def test_a_model_whose_own_names_start_with_model_keeps_them(self, tmp_path):
        """A Hugging Face causal LM saved bare: ``model.layers...`` beside ``lm_head``;
        ``model.`` is its own names, not a stack's prefix."""
        net = _net()
        state = {"model.embed.weight": net[0].weight.detach().clone(),
                 "model.layers.0.weight": net[2].weight.detach().clone(),
                 "lm_head.weight": net[0].weight.detach().clone() * 2}
        _save(dict(state), tmp_path / "ck")
        got = _read(tmp_path / "ck")
        assert sorted(got) == sorted(state)
        assert all(torch.equal(got[n], v) for n, v in state.items())

    def test_a_folder_with_no_model_tensor_says_where_they_are(self, tmp_path):
        _save({"net": _net().state_dict()}, tmp_path / "ck")
        with pytest.raises(ModelSourceError, match=r"under \['net'\].*'prefix': 'NAME.'"):
            DcpReader(str(tmp_path / "ck"), prefix="model.x.")

    def test_a_view_reads_its_rows_exactly(self, tmp_path):
        """Rows 8..16 and a strided slice of the first weight, exact (that only the chunks
        holding the rows are read is counted in the two-rank test below)."""
        want = _trained(tmp_path / "ck")
        reader = DcpReader(str(tmp_path / "ck"))
        got = reader.read("0.weight", ((8, 16, 1),))
        assert torch.equal(got, want["0.weight"][8:16])
        assert torch.equal(reader.read("0.weight", (3, (2, None, 3))), want["0.weight"][3, 2::3])

    def test_track_on_a_run_of_step_folders(self, tmp_path, capsys):
        """torchtitan's step-N/, plain stepN/ and OLMo-core's stepN/model_and_optim/, steps
        from the folder names."""
        from diffract.cli import main

        run = tmp_path / "run"
        for i, folder in enumerate(["step-100", "step200", "step300/model_and_optim"]):
            torch.manual_seed(i)
            _trained(run / folder)
        assert main(["track", str(run), "--store", str(tmp_path / "s"), "--metrics",
                     "stable_rank", "--executor", "sequential", "--against", "none"]) == 0
        assert "added 3 checkpoint(s): step-100, step200, step300" in capsys.readouterr().out
        with Session("local", path=str(tmp_path / "s")) as s:
            assert [s.models.steps()[m]["step"] for m in s.models.ordered()] == [100, 200, 300]

    def test_a_store_reopens_it_and_refuses_a_changed_one(self, tmp_path):
        want = _trained(tmp_path / "ck")
        path = str(tmp_path / "store")
        with Session("local", path=path) as s:
            s.models.add(tmp_path / "ck", "m")
        with Session("local", path=path) as s:
            np.testing.assert_array_equal(s.store.load_weights("m", "0.weight"),
                                          want["0.weight"].numpy())
        _save({"model": _net(seed=5).state_dict()}, tmp_path / "ck")  # saved over
        with Session("local", path=path) as s, pytest.raises(ModelSourceError,
                                                             match="changed|modified"):
            s.store.load_weights("m", "0.weight")


    def test_a_shard_rewritten_in_place_with_its_times_restored_is_refused(self, tmp_path):
        """Same size, same inode, the modification time put back: the change time still
        tells the file from the one the reader opened (rewritten until the clock, whose
        tick is coarse, has moved: an event, not a wait)."""
        _trained(tmp_path / "ck")
        reader = DcpReader(str(tmp_path / "ck"))
        shard = next((tmp_path / "ck").glob("*.distcp"))
        before = shard.stat()
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF
        while shard.stat().st_ctime_ns == before.st_ctime_ns:
            with open(shard, "r+b") as fh:
                fh.write(data)
            os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = shard.stat()
        assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
            before.st_size, before.st_mtime_ns, before.st_ino)
        with pytest.raises(ModelSourceError, match="the file changed since the checkpoint"):
            reader.read("0.weight")

    def test_a_chunk_of_another_dtype_than_the_metadatas_is_refused_not_cast(self, tmp_path):
        """The metadata says bfloat16 where the shard holds float32 (the bytes are
        enough for either): the read is refused, naming both, never cast."""
        _trained(tmp_path / "ck")
        metadata = _metadata(tmp_path / "ck")
        metadata.state_dict_metadata["model.0.weight"].properties.dtype = torch.bfloat16
        _write_metadata(tmp_path / "ck", metadata)
        reader = DcpReader(str(tmp_path / "ck"))
        with pytest.raises(ModelSourceError, match=r"holds a \(32, 24\) torch.float32 tensor, "
                                                   r"the metadata says \(32, 24\) torch.bfloat16"):
            reader.read("0.weight")


# -- safety ------------------------------------------------------------------------------
def _metadata(folder: Path):
    with open(folder / ".metadata", "rb") as fh:
        return pickle.load(fh)  # our own file, written just now by dcp.save


def _write_metadata(folder: Path, metadata) -> None:
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


class _Touch:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


class TestHostile:
    def test_a_metadata_that_would_run_code_is_refused_and_runs_nothing(self, tmp_path):
        _trained(tmp_path / "ck")
        marker = tmp_path / "pwned"
        metadata = _metadata(tmp_path / "ck")
        metadata.planner_data = _Touch(str(marker))
        _write_metadata(tmp_path / "ck", metadata)
        with pytest.raises(ModelSourceError, match=r"asks for (posix|os)\.system.*never runs"):
            DcpReader(str(tmp_path / "ck"))
        with Session() as s, pytest.raises(ModelSourceError, match="never runs"):
            s.models.add(tmp_path / "ck", "m")
        assert not marker.exists()

    def test_a_dotted_name_of_an_allowed_module_is_refused(self, tmp_path):
        """``pathlib.Path.touch`` through an allowed module is still refused."""
        _trained(tmp_path / "ck")
        evil = (b"\x80\x04\x8c\x07pathlib\x94\x8c\nPath.touch\x94\x93\x94.")
        (tmp_path / "ck" / ".metadata").write_bytes(evil)
        with pytest.raises(ModelSourceError, match=r"pathlib\.Path\.touch"):
            DcpReader(str(tmp_path / "ck"))

    @pytest.mark.parametrize("where", ["../outside.distcp", "/etc/passwd", "sub/../../x"])
    def test_a_shard_outside_the_folder_is_refused(self, tmp_path, where):
        _trained(tmp_path / "ck")
        (tmp_path / "outside.distcp").write_bytes(b"x" * 10_000)
        metadata = _metadata(tmp_path / "ck")
        for info in metadata.storage_data.values():
            info.relative_path = where
        _write_metadata(tmp_path / "ck", metadata)
        with pytest.raises(ModelSourceError, match="outside the checkpoint's folder"):
            DcpReader(str(tmp_path / "ck"))

    def test_a_link_out_of_the_folder_is_refused(self, tmp_path):
        _trained(tmp_path / "ck")
        shard = next((tmp_path / "ck").glob("*.distcp"))
        outside = tmp_path / "elsewhere.distcp"
        shard.rename(outside)
        shard.symlink_to(outside)
        with pytest.raises(ModelSourceError, match=r"^tensor '.*': '__0_0.distcp' resolves "
                                                   r"to .*elsewhere.distcp', outside the "
                                                   r"checkpoint's folder"):
            DcpReader(str(tmp_path / "ck"))

    def test_a_range_past_the_file_is_refused_before_anything_is_read(self, tmp_path):
        _trained(tmp_path / "ck")
        metadata = _metadata(tmp_path / "ck")
        info = next(iter(v for k, v in metadata.storage_data.items()
                         if k.fqn == "model.0.weight"))
        info.length = 1 << 40  # a terabyte declared: refused, never allocated
        _write_metadata(tmp_path / "ck", metadata)
        with pytest.raises(ModelSourceError, match="cut short, or not this checkpoint's"):
            DcpReader(str(tmp_path / "ck"))

    def test_a_short_shard_is_named_with_its_tensor_not_as_damaged_metadata(self, tmp_path):
        """A .distcp cut short: the message says which tensor, which bytes, which file,
        whole (it began 'the metadata is damaged' and was cut at 200 characters)."""
        _trained(tmp_path / "ck")
        shard = next((tmp_path / "ck").glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:100])
        with pytest.raises(ModelSourceError) as caught:
            DcpReader(str(tmp_path / "ck"))
        assert re.fullmatch(r"tensor '[\w.]+': the metadata puts a chunk at bytes \d+\.\.\d+ "
                            r"of a 100-byte file \(cut short, or not this checkpoint's\) "
                            rf"\('{re.escape(str(shard))}'\)", str(caught.value)), caught.value

    def test_a_chunk_holding_another_shape_is_refused(self, tmp_path):
        _trained(tmp_path / "ck")
        metadata = _metadata(tmp_path / "ck")
        index = {k.fqn: v for k, v in metadata.storage_data.items()}
        index["model.0.weight"].offset = index["model.2.weight"].offset
        index["model.0.weight"].length = index["model.2.weight"].length
        _write_metadata(tmp_path / "ck", metadata)
        reader = DcpReader(str(tmp_path / "ck"))
        with pytest.raises(ModelSourceError, match=r"holds a \(16, 32\).*says \(32, 24\)"):
            reader.read("0.weight")

    def test_fuzzed_metadata_and_shards_fail_only_with_the_documented_error(self, tmp_path):
        """Seeded mutations of the metadata's and a shard's bytes: a ModelSourceError or
        a read of the declared shapes, never another exception, never code run."""
        _trained(tmp_path / "base")
        base = {p.name: p.read_bytes() for p in (tmp_path / "base").iterdir()}
        rng = np.random.default_rng(35)
        refused = tried = 0
        for trial in range(300):
            folder = tmp_path / f"f{trial % 4}"
            folder.mkdir(exist_ok=True)
            for name, data in base.items():
                (folder / name).write_bytes(data)
            name = ".metadata" if trial % 2 else next(n for n in base if n.endswith(".distcp"))
            data = bytearray(base[name])
            for _ in range(int(rng.integers(1, 6))):
                data[int(rng.integers(len(data)))] = int(rng.integers(256))
            if rng.random() < 0.2:
                data = data[: int(rng.integers(len(data)))]
            (folder / name).write_bytes(bytes(data))
            tried += 1
            try:
                reader = DcpReader(str(folder))
                for entry in reader.entries():
                    assert tuple(reader.read(entry.name).shape) == entry.shape
            except ModelSourceError:
                refused += 1
        assert tried == 300 and 0 < refused < tried


# -- two ranks ---------------------------------------------------------------------------
_RANK = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 16, bias=False))
    mesh = init_device_mesh("cpu", (2,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 24)).sum().backward()
    opt.step()
    whole = {k: v.full_tensor() for k, v in model.state_dict().items()}
    if rank == 0:
        torch.save(whole, out + "/whole.pt")
    dcp.save({"model": model.state_dict(), "optim": opt.state_dict()},
             checkpoint_id=out + "/ck")
    # Both ranks done before the group goes; then leave without the interpreter's
    # teardown, where gloo's C++ threads sometimes abort a finished process
    # ("terminate called without an active exception", seen in CI).
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
""")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="no gloo")
def test_an_fsdp2_checkpoint_of_two_ranks_is_assembled_exactly(tmp_path, monkeypatch):
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    port = str(_free_port())
    ranks = [subprocess.Popen([sys.executable, str(script), str(r), port, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    for proc in ranks:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    assert sorted(p.name for p in (tmp_path / "ck").glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    got = _read(tmp_path / "ck")
    assert sorted(got) == sorted(whole)
    assert all(torch.equal(got[n], v) for n, v in whole.items())
    # each weight is sharded by rows over the two ranks: rows of one half read one chunk
    reader = DcpReader(str(tmp_path / "ck"))
    read = []
    real = reader._item

    def counted(name, file, start, length, *rest):
        read.append((Path(file).name, length))
        return real(name, file, start, length, *rest)

    monkeypatch.setattr(reader, "_item", counted)
    assert torch.equal(reader.read("0.weight", ((0, 16, 1),)), whole["0.weight"][:16])
    assert [f for f, _ in read] == ["__0_0.distcp"]
    read.clear()
    assert torch.equal(reader.read("0.weight", ((20, 30, 1),)), whole["0.weight"][20:30])
    assert [f for f, _ in read] == ["__1_0.distcp"]
    with open(tmp_path / "ck" / ".metadata", "rb") as fh:
        chunks = pickle.load(fh).state_dict_metadata["model.0.weight"].chunks
    assert [tuple(c.offsets) for c in chunks] == [(0, 0), (16, 0)]


class TestDeclaredSizes:
    def _edit(self, folder: Path, edit) -> None:
        metadata = _metadata(folder)
        edit(metadata)
        _write_metadata(folder, metadata)

    def test_a_chunk_declaring_more_entries_than_its_bytes_is_refused(self, tmp_path):
        """Memory follows what a chunk holds: a 2**40-entry tensor declared over a few
        hundred bytes is refused when the model is added, never allocated."""
        _trained(tmp_path / "ck")

        def huge(metadata):
            entry = metadata.state_dict_metadata["model.0.weight"]
            entry.size = torch.Size([1 << 20, 1 << 20])
            entry.chunks[0].sizes = torch.Size([1 << 20, 1 << 20])

        self._edit(tmp_path / "ck", huge)
        with pytest.raises(ModelSourceError, match="fewer than its entries take"):
            DcpReader(str(tmp_path / "ck"))

    def test_chunks_that_do_not_tile_the_tensor_are_refused(self, tmp_path):
        _trained(tmp_path / "ck")

        def gap(metadata):  # one chunk twice at the same place, the tensor twice as tall
            entry = metadata.state_dict_metadata["model.0.weight"]
            entry.size = torch.Size([64, 24])
            entry.chunks.append(entry.chunks[0])

        self._edit(tmp_path / "ck", gap)
        with pytest.raises(ModelSourceError, match="do not tile its shape"):
            DcpReader(str(tmp_path / "ck"))
