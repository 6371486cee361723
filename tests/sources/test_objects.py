"""Checkpoints read in place from a real S3-compatible server on 127.0.0.1 (moto's,
started by conftest.py): values bit for bit as the same files read from disk, bytes moved
against what the analysed tensors and headers take, the safety rules of local files,
and an object rewritten after it was added refused."""

from __future__ import annotations

import json
import re
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from diffract import Session
from diffract.errors import ModelSourceError

torch = pytest.importorskip("torch")


def _weights(seed: int, n: int = 4, shape=(96, 64)) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"layers.{i}.mlp.weight": rng.standard_normal(shape).astype(np.float32)
            for i in range(n)}


def _folder(root: Path, seed: int, *, shards: int = 2, bf16: bool = False) -> Path:
    """A Hugging Face-style folder: ``shards`` safetensors shards, their index, config."""
    root.mkdir(parents=True, exist_ok=True)
    weights = _weights(seed)
    if bf16:
        weights = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in weights.items()}
    names = sorted(weights)
    weight_map = {}
    for s in range(shards):
        part = {n: weights[n] for n in names[s::shards]}
        shard = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        if bf16:
            from safetensors.torch import save_file as save_torch

            save_torch(part, str(root / shard))
        else:
            save_file(part, str(root / shard))
        weight_map.update(dict.fromkeys(part, shard))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"hidden_size": 64}))
    return root


def _header_bytes(path: Path) -> int:
    with open(path, "rb") as fh:
        return 8 + int.from_bytes(fh.read(8), "little")


def _values(session: Session, model_id: str) -> dict[str, np.ndarray]:
    return {p.name: session.store.load_weights(model_id, p.name)
            for p in session.models.params(model_id)}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert np.array_equal(a[name].view(np.uint8), b[name].view(np.uint8)), name


class TestSafetensors:
    def test_a_file_reads_as_from_disk_moving_only_its_header_and_the_tensors_read(
            self, s3, tmp_path):
        local = tmp_path / "m.safetensors"
        save_file(_weights(0, n=6), str(local))
        url = s3.put_tree(local, "single/m.safetensors")
        with Session() as disk, Session() as remote:
            disk.models.add(str(local), model_id="m")
            s3.reset()
            remote.models.add(url, model_id="m")
            assert s3.object_bytes == _header_bytes(local)  # the header, nothing else
            wanted = ["layers.1.mlp.weight", "layers.4.mlp.weight"]
            for name in wanted:
                assert np.array_equal(remote.store.load_weights("m", name),
                                      disk.store.load_weights("m", name))
            tensors = sum(disk.store.load_weights("m", n).nbytes for n in wanted)
            assert s3.object_bytes <= 1.05 * (tensors + _header_bytes(local))
            _same(_values(remote, "m"), _values(disk, "m"))
            assert remote.models.list()[0]["source"] == url

    def test_a_sharded_bf16_folder_with_its_config_and_views(self, s3, tmp_path):
        local = _folder(tmp_path / "step-100", 1, bf16=True)
        url = s3.put_tree(local, "hf/step-100")
        with Session() as disk, Session() as remote:
            disk.models.add(str(local), model_id="m")
            remote.models.add(url + "/", model_id="m")
            _same(_values(remote, "m"), _values(disk, "m"))
            assert remote.models.steps()["m"] == {"step": 100}
            source = remote.store.source("m")
            assert source.kind == "directory" and len(source.files) == 2
            assert all(f.path.startswith("s3://runs/hf/step-100/") and f.etag
                       for f in source.files)

    def test_view_rules_read_the_config_json_beside_the_weights(self, s3, tmp_path):
        local = tmp_path / "attn"
        local.mkdir()
        rng = np.random.default_rng(3)
        save_file({f"model.layers.0.self_attn.{p}_proj.weight":
                   rng.standard_normal((64, 64)).astype(np.float32) for p in "qkvo"},
                  str(local / "model.safetensors"))
        (local / "config.json").write_text(json.dumps(
            {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4}))
        url = s3.put_tree(local, "views/attn")
        with Session() as disk, Session() as remote:
            on_disk = disk.models.add(str(local), model_id="m", views=["heads"])
            in_s3 = remote.models.add(url, model_id="m", views=["heads"])
            assert list(in_s3) == list(on_disk) and len(in_s3) > 4
            _same(_values(remote, "m"), _values(disk, "m"))

    def test_a_durable_store_reopens_it_and_checks_the_objects(self, s3, tmp_path):
        local = _folder(tmp_path / "ckpt", 2)
        url = s3.put_tree(local, "durable/ckpt")
        store = tmp_path / "a.diffract"
        with Session(profile="local", path=str(store)) as first:
            first.models.add(url, model_id="m")
            expected = _values(first, "m")
        with Session(profile="local", path=str(store)) as again:
            _same(_values(again, "m"), expected)
            assert again.store.source("m").changed_files() == []
            s3.client.put_object(Bucket="runs", Key="durable/ckpt/model-00001-of-00002."
                                 "safetensors", Body=b"rewritten")
            changed = again.store.source("m").changed_files()
            assert len(changed) == 1 and "model-00001-of-00002" in changed[0]
            with pytest.raises(ModelSourceError, match="changed since the model was added"):
                _values(again, "m")


class TestDcp:
    def test_a_dcp_folder_reads_only_its_metadata_then_the_chunks_read(self, s3, tmp_path):
        import torch.distributed.checkpoint as dcp

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.Linear(64, 32))
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(2, 48)).sum().backward()
        opt.step()
        folder = tmp_path / "step-7"
        with warnings.catch_warnings():  # one process, no process group
            warnings.simplefilter("ignore")
            dcp.save({"model": model.state_dict(), "optim": opt.state_dict()},
                     checkpoint_id=str(folder))
        url = s3.put_tree(folder, "dcp/step-7")
        with Session() as disk, Session() as remote:
            disk.models.add(str(folder), model_id="m")
            s3.reset()
            remote.models.add(url, model_id="m")
            metadata = (folder / ".metadata").stat().st_size
            assert s3.object_bytes == metadata
            weight = remote.store.load_weights("m", "1.weight")
            assert np.array_equal(weight, disk.store.load_weights("m", "1.weight"))
            # the chunk as stored (torch.save's zip around 64x32 float32) and no more
            assert s3.object_bytes - metadata <= 1.05 * weight.nbytes + 4096
            _same(_values(remote, "m"), _values(disk, "m"))


class TestRefused:
    def test_a_header_declaring_2_to_the_60_bytes_is_refused_as_on_disk(self, s3, tmp_path):
        bad = tmp_path / "bad.safetensors"
        bad.write_bytes((1 << 60).to_bytes(8, "little") + b"{}")
        url = s3.put_tree(bad, "hostile/bad.safetensors")
        with Session() as session:
            with pytest.raises(ModelSourceError) as local:
                session.models.add(str(bad), model_id="a")
            with pytest.raises(ModelSourceError) as remote:
                session.models.add(url, model_id="b")
        said = "the header declares 1152921504606846976 bytes, over the 100 MB"
        assert said in str(local.value) and said in str(remote.value)
        assert s3.object_bytes <= 16  # its length field: nothing it declares is fetched

    @pytest.mark.parametrize("shard", ["../other/model.safetensors",
                                       "../ckpt-evil/model.safetensors", "/etc/passwd",
                                       "s3://runs/other/model.safetensors"])
    def test_a_shard_index_naming_an_object_outside_the_prefix(self, s3, tmp_path, shard):
        local = _folder(tmp_path / "ckpt", 3, shards=1)
        s3.put_tree(local / "model-00001-of-00001.safetensors",
                    "other/model.safetensors")
        s3.put_tree(local / "model-00001-of-00001.safetensors",
                    "ckpt-evil/model.safetensors")
        index = json.loads((local / "model.safetensors.index.json").read_text())
        index["weight_map"] = dict.fromkeys(index["weight_map"], shard)
        (local / "model.safetensors.index.json").write_text(json.dumps(index))
        url = s3.put_tree(local, "ckpt")
        s3.reset()
        with Session() as session, pytest.raises(ModelSourceError,
                                                  match="outside the checkpoint's prefix|names "
                                                        "no object under"):
            session.models.add(url, model_id="m")
        assert not [r for r in s3.requests if "other" in r[1] or "evil" in r[1]]

    def test_an_object_rewritten_after_it_was_added_is_refused_on_read(self, s3, tmp_path):
        local = tmp_path / "m.safetensors"
        save_file(_weights(4), str(local))
        url = s3.put_tree(local, "rewritten/m.safetensors")
        with Session() as session:
            session.models.add(url, model_id="m")
            save_file(_weights(5), str(local))  # the same size, other values
            s3.put_tree(local, "rewritten/m.safetensors")
            with pytest.raises(ModelSourceError, match=r"rewritten \(its version tag went"):
                session.store.load_weights("m", "layers.0.mlp.weight")

    @pytest.mark.parametrize("options, named", [
        ({"secret": "s3cr3t-value"}, "secret"),
        ({"client_kwargs": {"aws_secret_access_key": "s3cr3t-value"}},
         "client_kwargs.aws_secret_access_key"),
        ({"config_kwargs": {"proxies": {"https": "http://u:s3cr3t-value@proxy:3128"}}},
         "config_kwargs.proxies.https"),
        ({"connection_string": "AccountKey=s3cr3t-value"}, "connection_string"),
        ({"sas_token": "s3cr3t-value"}, "sas_token"), ({"passwd": "s3cr3t-value"}, "passwd"),
        ({"headers": {"Authorization": "Bearer s3cr3t-value"}}, "headers.Authorization"),
        ({"token": "s3cr3t-value"}, "token"), ({"auth": ["u", "s3cr3t-value"]}, "auth"),
        ({"endpoint_url": "http://u:s3cr3t-value@127.0.0.1:9"}, "endpoint_url"),
        ({"bogus_option": 1}, "bogus_option"),
    ])
    def test_only_options_known_to_hold_no_credential_are_taken(self, s3, tmp_path, options,
                                                                  named):
        """Options are recorded with the model: anything not on the allow-list, at any
        depth (s3fs hands client_kwargs to botocore), and any URL with a password are
        refused, naming the option and never its value; nothing is stored."""
        save_file(_weights(11), str(tmp_path / "m.safetensors"))
        url = s3.put_tree(tmp_path / "m.safetensors", "options/m.safetensors")
        with Session() as session:
            with pytest.raises(ModelSourceError, match=re.escape(named)) as caught:
                session.models.add(url, model_id="m",
                                   format_options={"storage_options": options})
            assert "s3cr3t" not in str(caught.value) and session.model_ids == []

    def test_the_options_users_need_are_taken(self, s3, tmp_path):
        save_file(_weights(11), str(tmp_path / "m.safetensors"))
        url = s3.put_tree(tmp_path / "m.safetensors", "options/m.safetensors")
        options = {"endpoint_url": s3.endpoint, "config_kwargs": {
            "s3": {"addressing_style": "path"}, "retries": {"max_attempts": 2}},
            "client_kwargs": {"region_name": "us-east-1"}}
        with Session() as session:
            session.models.add(url, model_id="m", format_options={"storage_options": options})
            assert dict(session.store.source("m").format_options)["storage_options"] == options

    def test_a_scheme_no_plugin_reads_says_what_to_install(self):
        with Session() as session, pytest.raises(ModelSourceError,
                                                  match="no installed model format reads "
                                                        "ftp:// URLs"):
            session.models.add("ftp://host/m.safetensors", model_id="m")


class TestHostileServer:
    """The loopback server made hostile (issue 73.2): an object swapped for one with the
    same tensors laid out the other way round (same size) between two reads, a server
    that answers a range with the whole object, URLs with no bucket."""

    def _swapped(self, tmp_path):
        """Two files of one size whose two tensors swap places: read mixed, ``l0`` gets
        ``l1``'s values."""
        a, b = np.full((32, 32), 1.0, np.float32), np.full((32, 32), 2.0, np.float32)
        first, second = tmp_path / "first.safetensors", tmp_path / "second.safetensors"
        save_file({"l0": a, "l1": b}, str(first))
        save_file({"l0": b, "l1": a}, str(second))  # offsets the other way round
        assert first.stat().st_size == second.stat().st_size
        return first, second

    def _swap_when(self, s3, second, key, when):
        """Rewrite ``key`` with ``second`` once, just before the request ``when`` picks."""
        done = threading.Event()
        client = s3.client

        def hook(environ):
            if not done.is_set() and when(environ) and key in environ.get("PATH_INFO", ""):
                done.set()
                client.upload_file(str(second), s3.bucket, key)
        s3.hook = hook
        return done

    def test_swapped_between_the_header_and_the_identity_is_refused(self, s3, tmp_path):
        first, second = self._swapped(tmp_path)
        url = s3.put_tree(first, "swap/a.safetensors")
        gets = []

        def second_get(environ):  # the header's second GET: its JSON
            gets.append(environ) if environ["REQUEST_METHOD"] == "GET" and environ.get(
                "HTTP_RANGE") else None
            return len(gets) == 2
        done = self._swap_when(s3, second, "swap/a.safetensors", second_get)
        with Session() as session:
            with pytest.raises(ModelSourceError, match=r"changed while it was read.*"
                                                       r"swap/a.safetensors"):
                session.models.add(url, model_id="m")
                _values(session, "m")  # refused at add, or at the first read: never mixed
        assert done.is_set()

    def test_swapped_between_the_identity_and_a_tensors_read_is_refused(self, s3, tmp_path):
        first, second = self._swapped(tmp_path)
        url = s3.put_tree(first, "swap/b.safetensors")
        with Session() as session:
            session.models.add(url, model_id="m")
            done = self._swap_when(s3, second, "swap/b.safetensors",
                                   lambda e: e["REQUEST_METHOD"] == "GET")
            with pytest.raises(ModelSourceError, match=r"changed while it was read.*"
                                                       r"swap/b.safetensors"):
                session.store.load_weights("m", "l0")
        assert done.is_set()

    def test_a_server_that_answers_a_range_with_the_whole_object(self, s3, tmp_path):
        local = tmp_path / "m.safetensors"
        save_file(_weights(7), str(local))
        url = s3.put_tree(local, "whole/m.safetensors")
        s3.hook = lambda environ: environ.pop("HTTP_RANGE", None)  # as gcp-storage-emulator
        with Session() as disk, Session() as remote:
            disk.models.add(local, model_id="m")
            remote.models.add(url, model_id="m")
            _same(_values(remote, "m"), _values(disk, "m"))

    @pytest.mark.parametrize("url", ["s3://", "s3:///", "gs://", "s3://runs", "s3:///x"])
    def test_a_url_with_no_bucket_or_object_is_one_line(self, s3, url, capsys):
        from diffract.cli import main

        assert main(["analyze", url, "-q"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and "IndexError" not in err


class TestOtherStores:
    """The readers over another fsspec file system than S3's (fsspec's in-memory one: no
    server), and the version tag of each store's object records."""

    def test_a_folder_in_fsspecs_memory_file_system(self, tmp_path):
        import fsspec

        from diffract_sources_fsspec.objects import open_url

        memory = fsspec.filesystem("memory")
        local = _folder(tmp_path / "ckpt", 6)
        for f in local.iterdir():
            memory.pipe_file(f"/mem-run/ckpt/{f.name}", f.read_bytes())
        reader = open_url("memory://mem-run/ckpt")
        with Session() as disk:
            disk.models.add(str(local), model_id="m")
            for entry in reader.entries():
                assert np.array_equal(reader.read_numpy(entry.name),
                                      disk.store.load_weights("m", entry.name))
        assert reader.config()["hidden_size"] == 64
        memory.rm("/mem-run", recursive=True)

    @pytest.mark.parametrize(("info", "tag"), [
        ({"name": "b/k", "size": 3, "ETag": '"9a0364b9e99bb480dd25e1f0284c8555"'},
         "9a0364b9e99bb480dd25e1f0284c8555"),                         # S3
        ({"name": "b/k", "size": 3, "generation": "1733356800123456", "etag": "CJ+Bx"},
         "1733356800123456"),                                         # GCS: the generation
        ({"name": "org/m/model.safetensors", "size": 3, "blob_id": "e69de29b",
          "lfs": {"sha256": "0" * 64}}, "e69de29b"),                  # the Hub
        ({"name": "x", "size": 3, "lfs": {"sha256": "ab" * 32}}, "ab" * 32),
    ])
    def test_the_version_tag_of_each_store(self, info, tag):
        from diffract_sources_fsspec.objects import _tag

        assert _tag(info) == tag


@pytest.mark.parametrize("executor", ["sequential", "processes"])
def test_views_are_sliced_from_their_parent_read_once(s3, tmp_path, monkeypatch, executor):
    """A parameter's views run right after it (units by family, largest family first),
    while it is among the recent parents kept: from object storage, a model analysed with
    its views moves its bytes once, however many parents it has (the views' units used
    to run after every parent, which had left the recent ones by then, so each view
    fetched its slice again: 1.64x on OLMo-2-1B with --views heads). In the pool, a
    parameter's views go in its task."""
    import diffract.core.models as models

    local = tmp_path / "attn"
    local.mkdir()
    rng = np.random.default_rng(7)
    save_file({f"model.layers.{i}.self_attn.{p}_proj.weight":
               rng.standard_normal((128, 128)).astype(np.float32)
               for i in range(4) for p in "qkvo"}, str(local / "model.safetensors"))
    (local / "config.json").write_text(json.dumps(
        {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4}))
    url = s3.put_tree(local, "views/family")
    monkeypatch.setattr(models, "RECENT_BYTES", 2 * 128 * 128 * 4)  # two parents kept
    # (the pool's workers keep 256 MiB, but used to get a parent and its views in tasks
    # of their own: each worker that ran a view fetched its slice)
    with Session(executor=executor, config={"parallel": {"pool_min_seconds": 0}}) as session:
        session.models.add(url, model_id="m", views=["heads"])
        s3.reset()
        session.compute.apply("esd")
        assert len(session.results.export_metrics("esd")["m"]) > 16
    size = (local / "model.safetensors").stat().st_size
    opened = 1 if executor == "sequential" else 2  # each pool worker reads the header
    assert s3.object_bytes <= size + (opened - 1) * _header_bytes(local / "model.safetensors")


@pytest.mark.parametrize("executor", ["sequential", "threads", "processes"])
def test_kernels_that_read_the_same_weights_share_one_read(s3, tmp_path, executor):
    """Two kernels of one apply that read the same weights (the esd and the svd, which
    ``diffract track`` asks together) run on one read of each parameter: in this process
    the unit's inputs are read once for both, in the pool both run in the unit's task
    and its worker reads it once (either way each was fetched twice before: 2.00x)."""
    local = tmp_path / "two.safetensors"
    save_file(_weights(11, n=6, shape=(128, 96)), str(local))
    url = s3.put_tree(local, "fused/two.safetensors")
    with Session(executor=executor, config={"parallel": {"pool_min_seconds": 0}}) as session:
        session.models.add(url, model_id="m")
        s3.reset()
        report = session.compute.apply("esd", "weights_svals")
        assert report.computed["esd"] == report.computed["svd"] == 6
        esd = session.results.export_metrics("esd")["m"]
        svals = session.results.export_metrics("weights_svals")["m"]
    for name, row in esd.items():  # each kernel's own values, from the one read
        assert np.allclose(np.sort(np.asarray(svals[name]["weights_svals"]) ** 2),
                           np.asarray(row["esd"]), rtol=1e-9, atol=1e-9)
    opened = 1 if executor != "processes" else 2  # each pool worker reads the header
    size = local.stat().st_size
    assert s3.object_bytes <= size + (opened - 1) * _header_bytes(local)


def test_a_remote_clusters_workers_fetch_the_objects_themselves(s3, tmp_path):
    """A Dask cluster given by address (remote: its workers need not see this machine's
    files) reads a checkpoint in object storage from the store itself: no weight passes
    through the session's process. ``read_files=false`` ships them from here."""
    distributed = pytest.importorskip("distributed")
    local = tmp_path / "remote.safetensors"
    save_file(_weights(12, n=4), str(local))
    url = s3.put_tree(local, "remote/remote.safetensors")
    names = sorted(_weights(12, n=4))

    def esd_of(options, refuse):
        config = {"parallel": {"pool_min_seconds": 0}}
        with Session(executor="dask", executor_options=options, config=config) as session:
            session.models.add(url, model_id="m")
            here, real = [], session.store.load_tensor
            session.store.load_tensor = lambda model_id, name: (
                refuse(name) if refuse else here.append(name) or real(model_id, name))
            session.compute.apply("esd")
            return sorted(session.results.export_metrics("esd")["m"]), here

    def refuse(name):
        raise AssertionError(f"{name} was read in the session's process")

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None, silence_logs=40) as cluster:
        address = {"address": cluster.scheduler_address}
        assert esd_of(address, refuse) == (names, [])
        assert esd_of({**address, "read_files": False}, None) == (names, names)


class TestHub:
    """``hf://org/name`` through huggingface_hub's own HfFileSystem, against a Hub on the
    loopback address (tests/sources/fake_hub.py: a revision, trees, paths-info, files by
    ranged resolve): the same reader, the same exact byte ranges."""

    @pytest.fixture
    def hub(self, tmp_path):
        pytest.importorskip("huggingface_hub")
        from werkzeug.serving import WSGIRequestHandler, make_server

        from tests.sources.fake_hub import FakeHub

        class Quiet(WSGIRequestHandler):
            def log_request(self, *args, **kwargs):
                pass

        repos = {"org/tiny": _folder(tmp_path / "org" / "tiny", 8)}
        fake = FakeHub(repos)
        server = make_server("127.0.0.1", 0, fake, threaded=True, request_handler=Quiet)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        fake.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        yield fake
        server.shutdown()
        thread.join()

    def test_a_sharded_repository_reads_as_from_disk_and_moves_what_is_read(self, hub):
        local = hub.repos["org/tiny"]
        options = {"storage_options": {"endpoint": hub.endpoint}}
        with Session() as disk, Session() as remote:
            disk.models.add(str(local), model_id="m")
            remote.models.add("hf://org/tiny", model_id="m", format_options=options)
            headers = sum(_header_bytes(f) for f in local.glob("*.safetensors"))
            index = (local / "model.safetensors.index.json").stat().st_size
            assert hub.sent == headers + index
            name = "layers.2.mlp.weight"
            weight = remote.store.load_weights("m", name)
            assert np.array_equal(weight, disk.store.load_weights("m", name))
            assert hub.sent == headers + index + weight.nbytes
            _same(_values(remote, "m"), _values(disk, "m"))
            files = remote.store.source("m").files
            assert [f.path for f in files] == [f"hf://org/tiny/{f.name}" for f in sorted(
                local.glob("*.safetensors"))] and all(len(f.etag) == 40 for f in files)
            # a commit that rewrites a shard: its blob id changes, and the read is refused
            save_file(_weights(9), str(local / files[0].path.rsplit("/", 1)[1]))
            with pytest.raises(ModelSourceError, match="changed since the model was added"):
                _values(remote, "m")

    def test_a_repository_that_does_not_exist(self, hub):
        with Session() as session, pytest.raises(ModelSourceError,
                                                  match="no such object, prefix or bucket"):
            session.models.add("hf://org/none", model_id="m", format_options={
                "storage_options": {"endpoint": hub.endpoint}})


class TestGcs:
    """``gs://`` through gcsfs against a GCS emulator on the loopback address
    (gcp-storage-emulator, in memory): the folder reader, the generation as the version
    tag, a rewritten object refused. (The emulator answers a ranged GET with the whole
    object, so bytes are counted against S3 and the Hub only.)"""

    @pytest.fixture
    def gcs(self, monkeypatch):
        pytest.importorskip("gcsfs")
        emulator = pytest.importorskip("gcp_storage_emulator.server")
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = emulator.create_server("127.0.0.1", port, in_memory=True,
                                        default_bucket="gruns")
        server.start()
        try:
            yield {"endpoint_url": f"http://127.0.0.1:{port}", "token": "anon"}
        finally:
            server.stop()

    def test_a_folder_in_gcs_reads_as_from_disk_and_a_rewrite_is_refused(self, gcs,
                                                                         tmp_path):
        import fsspec

        local = _folder(tmp_path / "step-3", 10, bf16=True)
        fs = fsspec.filesystem("gs", **gcs)
        for f in local.iterdir():
            fs.put(str(f), f"gruns/run/step-3/{f.name}")
        options = {"storage_options": gcs}
        with Session() as disk, Session() as remote:
            disk.models.add(str(local), model_id="m")
            remote.models.add("gs://gruns/run/step-3/", model_id="m", format_options=options)
            _same(_values(remote, "m"), _values(disk, "m"))
            assert remote.models.steps()["m"] == {"step": 3}
            files = remote.store.source("m").files
            assert all(f.etag == str(fs.info(f.path)["generation"]) for f in files)
            fs.put(str(local / "config.json"), files[0].path)  # another object there now
            with pytest.raises(ModelSourceError, match="changed since the model was added"):
                _values(remote, "m")


def test_fuzzed_storage_options_are_taken_or_refused_never_echoed():
    """Random nested options (allowed names, credential names, unknown ones; strings with
    and without passwords, numbers, lists, tables): taken as given, or one
    ModelSourceError that names no value; a credential at any depth is never taken."""
    import random

    from diffract_sources_fsspec.objects import ALLOWED, _checked_options

    rng = random.Random(5)
    names = sorted({k.split(".")[-1] for k in ALLOWED}) + [
        "client_kwargs", "config_kwargs", "s3", "retries", "aws_secret_access_key", "key",
        "secret", "token", "headers", "proxies", "connection_string", "sas_token", "passwd",
        "Authorization", "x"]

    def value(depth):
        kind = rng.random()
        if kind < 0.3 and depth < 4:
            return {rng.choice(names): value(depth + 1) for _ in range(rng.randint(1, 3))}
        if kind < 0.45:
            return [value(depth + 1) for _ in range(rng.randint(0, 2))] if depth < 4 else 1
        if kind < 0.7:
            return rng.choice(["eu-west-1", "http://127.0.0.1:9000", "path", "anon",
                               f"http://u:pw{rng.randrange(10**6)}x@h:1",
                               f"zz-value-{rng.randrange(10**9)}"])
        return rng.choice([True, False, None, 3, 2.5, -1])

    def strings(node):
        if isinstance(node, dict):
            return [s for v in node.values() for s in strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    def paths(node, at=""):
        if isinstance(node, dict):
            return [p for k, v in node.items() for p in paths(v, f"{at}.{k}" if at else k)]
        return [at]

    taken = refused = 0
    for _ in range(3000):
        options = {rng.choice(names): value(1) for _ in range(rng.randint(1, 3))}
        try:
            got = _checked_options(options)
        except ModelSourceError as exc:
            refused += 1
            text = str(exc)
            leaked = [s for s in strings(options) if len(s) > 6 and s in text]
            assert not leaked, (leaked, text)
        else:
            taken += 1
            assert got == options
            assert all(p in ALLOWED for p in paths(options)), paths(options)
            assert not [s for s in strings(options) if "@" in s]
    assert taken and refused


def test_every_s3_request_gets_the_deadline_unless_the_user_set_one(monkeypatch):
    """The limit reaches botocore's client (connect and read timeouts, two attempts in
    all) and s3fs does not retry again; options the user gives win."""
    from diffract_sources_fsspec.objects import ObjectFiles

    monkeypatch.setenv("DIFFRACT_REMOTE_TIMEOUT", "7")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    files = ObjectFiles.of("s3://runs/x", {"endpoint_url": "http://127.0.0.1:9"})
    assert files.fs.config_kwargs["read_timeout"] == 7
    assert files.fs.config_kwargs["connect_timeout"] == 7
    assert files.fs.config_kwargs["retries"] == {"total_max_attempts": 2}
    assert files.fs.retries == 1
    mine = ObjectFiles.of("s3://runs/x", {"endpoint_url": "http://127.0.0.1:9",
                                          "config_kwargs": {"read_timeout": 300}})
    assert mine.fs.config_kwargs["read_timeout"] == 300
    monkeypatch.setenv("DIFFRACT_REMOTE_TIMEOUT", "soon")
    with pytest.raises(ModelSourceError, match="DIFFRACT_REMOTE_TIMEOUT takes a number"):
        ObjectFiles.of("s3://runs/x", {})


def test_the_docs_shell_recipe_for_a_local_s3_runs_as_written(tmp_path):
    """docs/storage.md's shell block (moto's server, a bucket, `diffract analyze s3://`)
    run by bash as a user would, on a free port, with this environment's tools first on
    PATH; the analysis prints the checkpoint's layer (issue 77.6)."""
    import os
    import shutil
    import socket
    import subprocess
    import sys

    pytest.importorskip("moto")
    text = (Path(__file__).resolve().parents[2] / "docs" / "storage.md").read_text()
    block = re.search(r"<!-- docs-test: skip: a server in the background; tests/sources/"
                      r"test_objects.py runs the block whole -->\n```bash\n(.*?)```", text,
                      re.S).group(1)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert block.startswith("PORT=9000\n")
    bin_dir = str(Path(sys.executable).parent)
    if shutil.which("moto_server", path=bin_dir) is None:
        pytest.skip("moto_server is not installed beside this python")
    save_file({"layers.0.weight": np.eye(16, dtype=np.float32)}, str(tmp_path /
                                                                        "model.safetensors"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DIFFRACT_"))}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    run = subprocess.run(["bash", "-c", block.replace("PORT=9000", f"PORT={port}", 1)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "step-100: 1 layers" in run.stdout and "layers.0.weight" in run.stdout, run.stdout
