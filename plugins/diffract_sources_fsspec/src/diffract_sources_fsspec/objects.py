"""Checkpoints in object storage, read in place by byte ranges through fsspec.

A URL names a ``.safetensors`` object, a Hugging Face-style folder (a shard index with
its shards, or one ``model.safetensors``) or a torch.distributed.checkpoint folder (a
``.metadata`` with its ``.distcp`` objects; OLMo-core's ``model_and_optim/`` inside).
The readers are diffractml-formats' own, with every rule they hold on local files: a
safetensors header is read first (two ranged reads) and checked against the object's
size, then each tensor's byte range once when it is analysed; a DCP ``.metadata`` is
read first, unpickled only as DCP's metadata classes, then only the chunks a tensor
spans. Nothing is read outside the URL's prefix (a shard index or a ``.metadata`` that
names ``../other`` is refused), nothing is written to disk, no torch pickle is read.

An object's identity is its size and version tag (S3's ETag, GCS's generation, the
Hub's blob id): the core compares them before each read, and ``diffract track``
refuses a checkpoint rewritten since it was tracked. Where the store is and who may
read it come from the places its library reads (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``~/.aws``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``HF_TOKEN``...)
and from ``storage_options`` (recorded with the model, so only options known to hold no
credential are taken there: :data:`ALLOWED`).
"""

from __future__ import annotations

import copy
import os
import posixpath
import re
from collections.abc import Mapping
from typing import Any

from diffract.errors import ModelSourceError
from diffract.plugins import CheckpointReader, read_json_file
from diffract_formats._common import Config, error
from diffract_formats.dcp_reader import INNER, METADATA, DcpReader, read_metadata
from diffract_formats.quantized import wrap
from diffract_formats.readers import HuggingFaceReader, SafetensorsReader

__all__ = ["ObjectFiles", "checkpoint_urls", "open_url", "stat"]

#: The URL schemes read in place, and the package (and this distribution's extra) each needs.
PACKAGES = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"),
           "gcs": ("gcsfs", "gcs"), "hf": ("huggingface_hub", "hf"), "az": ("adlfs", None),
           "abfs": ("adlfs", None)}
#: The Hugging Face folder's files, in the order looked for (torch pickles are not read).
FOLDER_MARKERS = ("model.safetensors.index.json", "model.safetensors")
PICKLES = ("pytorch_model.bin.index.json", "pytorch_model.bin")
#: What the "inside" refusal of a shard index or a DCP metadata says to do.
OUTSIDE_HINT = "copy the object under the checkpoint's prefix"


def split(url: str) -> tuple[str, str]:
    """(scheme, path without it and without a trailing slash)."""
    scheme, _, rest = url.partition("://")
    return scheme, rest.rstrip("/")


def checked_url(url: str) -> str:
    """``url`` if it names a bucket (``s3://``, ``s3:///key`` do not), without a trailing
    slash; else a ModelSourceError saying the form."""
    scheme, sep, rest = str(url).partition("://")
    if not sep or not rest.strip("/") or rest.startswith("/"):
        raise ModelSourceError(f"{url!r} names no bucket: give {scheme or 's3'}://BUCKET/"
                               "PATH/TO/CHECKPOINT", model_id=None)
    return str(url).rstrip("/")


#: Schemes that name the same store as another.
_ALIASES = {"s3a": "s3", "gcs": "gs"}


def _credentials_hint(scheme: str) -> str:
    return {"s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/"
                  "credentials; --storage-option anon=true for a public bucket",
            "gs": "GOOGLE_APPLICATION_CREDENTIALS or gcloud auth application-default login",
            "hf": "HF_TOKEN or huggingface-cli login"}.get(_ALIASES.get(scheme, scheme),
                                                          "where its fsspec file system "
                                                          "reads them")


#: Seconds a remote request may go unanswered before it is given up (once retried); the
#: environment's DIFFRACT_REMOTE_TIMEOUT sets it.
REMOTE_TIMEOUT = 20.0


def remote_timeout() -> float:
    raw = os.environ.get("DIFFRACT_REMOTE_TIMEOUT", "")
    try:
        value = float(raw) if raw else REMOTE_TIMEOUT
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ModelSourceError(f"DIFFRACT_REMOTE_TIMEOUT takes a number of seconds above 0, "
                               f"got {raw!r}", model_id=None)
    return value


def _endpoint(scheme: str, options: Mapping[str, Any]) -> str:
    """Where requests go, as the user can check it (no credentials: refused before)."""
    client = options.get("client_kwargs") if isinstance(options.get("client_kwargs"),
                                                        Mapping) else {}
    given = options.get("endpoint_url") or client.get("endpoint_url") or options.get(
        "endpoint")
    env = {"s3": "AWS_ENDPOINT_URL", "hf": "HF_ENDPOINT",
           "gs": "STORAGE_EMULATOR_HOST"}.get(_ALIASES.get(scheme, scheme))
    return str(given or (os.environ.get(env) if env else None) or f"{scheme}'s default")


def _said(url: str, exc: BaseException, endpoint: str | None = None) -> ModelSourceError:
    """What went wrong at the object store, in one line saying what to fix."""
    scheme, what = split(url)[0], f"{type(exc).__name__}: {str(exc)[:160]}"
    endpoint_url = endpoint
    if isinstance(exc, ModelSourceError):
        return exc
    if isinstance(exc, FileNotFoundError) or "NotFound" in type(exc).__name__:
        return error(url, f"no such object, prefix or bucket ({what}); check the URL")
    if isinstance(exc, TypeError):  # s3fs hands its options to its client when it connects
        return error(url, f"the {scheme}:// file system refuses its storage options ({what}); "
                          "see its documentation for the options it takes")
    if isinstance(exc, PermissionError) or "Credential" in type(exc).__name__:
        return error(url, f"the object store refused access ({what}): give credentials "
                          f"where its library reads them ({_credentials_hint(scheme)})")
    endpoint = {"s3": "AWS_ENDPOINT_URL, or --storage-option endpoint_url=URL",
                "hf": "HF_ENDPOINT, or --storage-option endpoint=URL"}.get(
        _ALIASES.get(scheme, scheme), "--storage-option")
    where = f" at {endpoint_url}" if endpoint_url else ""
    return error(url, f"cannot reach the object store{where} ({what}; a request "
                      f"unanswered for {remote_timeout():g} s is given up, "
                      "DIFFRACT_REMOTE_TIMEOUT): check the endpoint "
                      f"({endpoint}), the network and the URL")


#: The storage options Diffract takes, each known to hold no credential, at the depth
#: the file systems take them (s3fs hands ``client_kwargs`` to its client and
#: ``config_kwargs`` to botocore's Config). Options are recorded with the model (a durable
#: store reads it again with them), so nothing else is taken: a credential, a proxy with
#: a password, a header, a connection string belong where the file system's library reads
#: them (its environment variables and config files).
ALLOWED = frozenset({
    "anon", "endpoint_url", "endpoint", "region_name", "region", "requester_pays",
    "version_aware", "use_ssl", "default_block_size", "default_cache_type", "block_size",
    "cache_regions", "max_concurrency", "skip_instance_cache", "use_listings_cache",
    "listings_expiry_time", "project", "access", "consistency", "requests_timeout",
    "timeout", "connect_timeout", "read_timeout", "retries", "account_name", "revision",
    "token", "client_kwargs.endpoint_url", "client_kwargs.region_name",
    "client_kwargs.verify", "client_kwargs.use_ssl", "config_kwargs.signature_version",
    "config_kwargs.connect_timeout", "config_kwargs.read_timeout",
    "config_kwargs.max_pool_connections", "config_kwargs.region_name",
    "config_kwargs.retries.max_attempts", "config_kwargs.retries.mode",
    "config_kwargs.retries.total_max_attempts",
    "config_kwargs.s3.addressing_style", "config_kwargs.s3.use_accelerate_endpoint"})
#: Values of ``token`` that name a way to authenticate (gcsfs, adlfs), not a secret.
MODES = {"anon", "google_default", "cloud", "cache", "browser"}
#: A URL holding a user name and password (``http://user:PASSWORD@proxy:3128``).
_USERINFO = re.compile(r"://[^/@\s]*:[^/@\s]*@")


def _checked_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` if every one, at every depth, is one of :data:`ALLOWED` with a value
    that holds no credential; else a ModelSourceError naming the options (never their
    values)."""
    options = dict(options or {})
    refused: list[str] = []
    with_password: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else str(key))
            return
        if path not in ALLOWED or path == "token" and not (
                node is None or isinstance(node, bool) or isinstance(node, str) and node in MODES):
            refused.append(path)
        elif isinstance(node, (list, tuple)):
            for item in node:
                walk(item, path)
        elif isinstance(node, str) and _USERINFO.search(node):
            with_password.append(path)

    walk(options, "")
    if refused or with_password:
        said = [f"{', '.join(sorted(set(refused)))}: not among the options Diffract takes "
                "(it records them with the model, so it takes only those known to hold no "
                "credential: endpoint_url, region_name, anon, client_kwargs.verify, "
                "config_kwargs.s3.addressing_style...)"] if refused else []
        said += [f"{', '.join(sorted(set(with_password)))}: a URL with a user name and "
                 "password"] if with_password else []
        raise ModelSourceError(
            "storage option(s) " + "; ".join(said) + ". Give credentials and other "
            "settings where the store's library reads them (its environment variables, "
            "such as AWS_*, HTTPS_PROXY, and its config files).", model_id=None)
    return copy.deepcopy(options)


class ObjectFiles:
    """One object store as diffractml-formats' readers see files: an object's size, a
    binary handle whose reads are ranged GETs (no read-ahead: what is read is what a
    reader asks for), and the "inside the prefix" rule."""

    def __init__(self, scheme: str, options: Mapping[str, Any] | None = None) -> None:
        import fsspec

        self.scheme = scheme
        try:
            fsspec.get_filesystem_class(scheme)
        except (ImportError, ValueError):
            package, extra = PACKAGES.get(scheme, (None, None))
            raise ModelSourceError(
                f"reading {scheme}:// needs {package or 'an fsspec implementation of it'}: "
                + (f"pip install 'diffractml-sources-fsspec[{extra}]'" if extra else
                   f"pip install {package}"), model_id=None) from None
        checked = _checked_options(options)  # a copy: s3fs adds to the nested ones
        self.endpoint = _endpoint(scheme, checked)
        limit = remote_timeout()
        base = _ALIASES.get(scheme, scheme)
        if base == "s3":  # every request answered within the limit, retried once
            conf = checked.setdefault("config_kwargs", {})
            conf.setdefault("connect_timeout", limit)
            conf.setdefault("read_timeout", limit)
            retries = conf.setdefault("retries", {})
            if "max_attempts" not in retries:  # botocore's: one try and one retry in all
                retries.setdefault("total_max_attempts", 2)
        elif base == "gs":
            checked.setdefault("requests_timeout", limit)
        try:
            self.fs = fsspec.filesystem(scheme, **checked)
        except (TypeError, ValueError) as exc:
            raise ModelSourceError(f"the {scheme}:// file system refuses its storage options "
                                   f"({type(exc).__name__}: {str(exc)[:160]}); see its "
                                   "documentation for the options it takes",
                                   model_id=None) from None
        if base == "s3" and "retries" not in (options or {}):
            self.fs.retries = 1  # botocore retries once (above); s3fs not again (5 by default)
        #: sizes seen: a handle needs its object's end (the core checks the object's size
        #: and tag before each read, so a handle opened later need not ask again)
        self._sizes: dict[str, int] = {}
        #: each object's (size, version tag) when this reader first saw it: every byte it
        #: reads is checked to come from that version (see :meth:`cat`)
        self._pinned: dict[str, tuple[int, str]] = {}

    @classmethod
    def of(cls, url: str, options: Mapping[str, Any] | None = None) -> ObjectFiles:
        return cls(split(url)[0], options)

    def call(self, url: str, what: Any) -> Any:
        """``what()``, its failure said as a ModelSourceError naming ``url`` (and, when
        the store cannot be reached, its endpoint)."""
        try:
            return what()
        except Exception as exc:  # noqa: BLE001 - every store's errors, said in one line
            raise _said(url, exc, self.endpoint) from None

    def info(self, url: str) -> dict[str, Any]:
        path = split(url)[1]
        self.fs.invalidate_cache(path)  # now, not as a listing saw it
        return self.call(url, lambda: self.fs.info(path))

    def stat(self, url: str) -> tuple[int, str]:
        """(size, version tag) of the object now."""
        info = self.info(url)
        if info.get("type") == "directory":
            raise error(url, "a prefix, not an object")
        now = (int(info["size"]), _tag(info))
        self._sizes[url] = now[0]
        self._pinned.setdefault(url, now)
        return now

    def size(self, url: str) -> int:
        return self.stat(url)[0]

    def open(self, url: str) -> Ranged:
        return Ranged(self, url, self._sizes.get(url) or self.size(url))

    def cat(self, url: str, start: int, stop: int) -> bytes:
        """Bytes ``start:stop`` of the object (one ranged GET)."""
        if stop <= start:
            return b""
        path = split(url)[1]

        def fetch() -> bytes:
            if hasattr(self.fs, "_cat_file"):  # an async file system (s3fs, gcsfs): one GET
                return self.fs.cat_file(path, start=start, end=stop)
            # others read through a file, which reads ahead unless told not to
            with self.fs.open(path, "rb", cache_type="none", block_size=stop - start) as fh:
                fh.seek(start)
                return fh.read(stop - start)

        data = self.call(url, fetch)
        if len(data) != stop - start:
            size = self._pinned.get(url, (self._sizes.get(url),))[0]
            if len(data) == size and stop <= len(data):  # a server that ignored the range
                data = data[start:stop]  # and sent the whole object (gcp-storage-emulator)
            else:
                raise error(url, f"asked for bytes {start} to {stop} ({stop - start}), the "
                                 f"store sent {len(data)}: refused")
        self._verify(url)
        return data

    def _verify(self, url: str) -> None:
        """After a read: the object is still the version first seen (a GET conditional
        on it, checked after, so that bytes of two versions are never mixed)."""
        pinned = self._pinned.get(url)
        if pinned is None:
            self._pinned[url] = self.stat(url)
            return
        info = self.info(url)
        now = (int(info.get("size", -1)), _tag(info))
        if now != pinned:
            raise error(url, f"the object changed while it was read (size {pinned[0]} -> "
                             f"{now[0]}, version tag {pinned[1]!r} -> {now[1]!r}): refused, "
                             "nothing of it is used; add the model again once it is written")

    def names(self, url: str) -> set[str]:
        """The names directly under the prefix ``url`` (one listing)."""
        path = split(url)[1]
        try:
            found = self.fs.ls(path, detail=False, refresh=True)
        except FileNotFoundError:
            return set()
        except Exception as exc:  # noqa: BLE001
            raise _said(url, exc, self.endpoint) from None
        return {posixpath.basename(str(p).rstrip("/")) for p in found}

    def inside(self, root: str, name: Any) -> str:
        """The URL of ``name`` under the prefix ``root``, when it lies there."""
        base = split(root)[1]
        if not isinstance(name, str) or not name or "://" in name or name.startswith("/"):
            raise error(root, f"{name!r} names no object under the checkpoint's prefix: "
                              f"refused; {OUTSIDE_HINT}")
        target = posixpath.normpath(posixpath.join(base, name))
        if not target.startswith(base + "/"):
            raise error(root, f"{name!r} resolves to {self.scheme}://{target}, outside the "
                              f"checkpoint's prefix {self.scheme}://{base}: Diffract reads "
                              f"only the checkpoint's own objects; {OUTSIDE_HINT}")
        return f"{self.scheme}://{target}"

    def json(self, url: str) -> Any:
        return read_json_file(self.open(url), url)

    def config(self, folder: str, names: set[str] | None = None) -> dict[str, Any]:
        """``config.json`` under ``folder`` (``names``: the folder's, when listed already),
        or {} when there is none."""
        if "config.json" not in (self.names(folder) if names is None else names):
            return {}
        url = self.inside(folder, "config.json")
        data = self.json(url)
        if not isinstance(data, dict):
            raise error(url, "config.json holds no JSON object; fix it, or give the geometry "
                             "as view options")
        return Config(data, url)


def _tag(info: Mapping[str, Any]) -> str:
    """The version tag an object store reports: what changes when the object is written."""
    for key in ("generation", "ETag", "etag", "VersionId", "blob_id", "md5Hash"):
        if info.get(key):
            return str(info[key]).strip('"')
    lfs = info.get("lfs")
    if isinstance(lfs, Mapping) and lfs.get("sha256"):
        return str(lfs["sha256"])
    return str(info.get("LastModified") or info.get("mtime") or info.get("created") or "")


class Ranged:
    """A read-only handle on an object: each ``read``/``readinto`` is one ranged GET of
    exactly the bytes asked for (up to the object's end)."""

    def __init__(self, files: ObjectFiles, url: str, size: int) -> None:
        self._files, self._url, self._size, self._at = files, url, size, 0

    def seek(self, offset: int, whence: int = 0) -> int:
        self._at = offset if whence == 0 else (self._at + offset if whence == 1
                                               else self._size + offset)
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, n: int = -1) -> bytes:
        stop = self._size if n is None or n < 0 else min(self._size, self._at + n)
        data = self._files.cat(self._url, self._at, stop)
        self._at += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        pass

    def __enter__(self) -> Ranged:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class ObjectSafetensorsReader(SafetensorsReader):
    """A ``.safetensors`` object; its configuration is the ``config.json`` beside it."""

    def __init__(self, url: str, files: ObjectFiles) -> None:
        self._objects = files
        super().__init__(url, files)

    def config(self) -> dict[str, Any]:
        return self._objects.config(self._file.path.rsplit("/", 1)[0])


class ObjectFolderReader(HuggingFaceReader):
    """A Hugging Face-style folder in object storage (safetensors shards only)."""

    def __init__(self, url: str, files: ObjectFiles, names: set[str]) -> None:
        self._root, self._objects, self._names = url, files, names
        shards: dict[str, list[str] | None] = {"model.safetensors": None}
        if FOLDER_MARKERS[0] in names:
            shards = self._index(files.inside(url, FOLDER_MARKERS[0]), files.json,
                                 lambda s: s in names or _exists(files, files.inside(url, s)))
        self._readers = [ObjectSafetensorsReader(files.inside(url, s), files) for s in shards]
        self._wanted = [set(n) if n is not None else None for n in shards.values()]
        self._where: dict[str, int] = {}

    def config(self) -> dict[str, Any]:
        return self._objects.config(self._root, self._names)


def _exists(files: ObjectFiles, url: str) -> bool:
    try:
        files.stat(url)
    except ModelSourceError:
        return False
    return True


class ObjectDcpReader(DcpReader):
    """A torch.distributed.checkpoint folder in object storage: the local reader's
    metadata rules and chunk checks, each chunk one ranged GET."""

    def __init__(self, url: str, files: ObjectFiles, names: set[str],
                 prefix: str | None = None) -> None:
        self._objects, self._checkpoint = files, url
        self._seen: dict[str, tuple[int, str]] = {}  # each file's stat, asked once at open
        self._root = url if METADATA in names else files.inside(url, INNER[0])
        self._metadata_path = files.inside(self._root, METADATA)
        self._indexed(read_metadata(self._metadata_path, files), prefix)

    def _inside(self, relative: Any, key: str) -> Any:
        try:
            url = self._objects.inside(self._root, relative)
        except ModelSourceError as exc:
            raise error(self._metadata_path, f"tensor {key!r}: {exc}") from None
        try:
            self._seen[url] = self._objects.stat(url)
        except ModelSourceError:
            raise error(self._metadata_path, f"tensor {key!r} is stored in {relative!r}, "
                                             "which is not an object under the checkpoint's "
                                             "prefix") from None
        return url

    def _measure(self, file: Any) -> tuple[int, Any]:
        stat = self._seen.pop(file, None) or self._objects.stat(file)
        return stat[0], stat

    def _bytes(self, name: str, file: Any, start: int, length: int) -> Any:
        if self._objects.stat(file) != self._stats[file]:
            raise error(file, f"tensor {name!r}: the object changed since the checkpoint was "
                              "opened (written over?); add the model again")
        data = self._objects.cat(file, start, start + length)
        if len(data) != length:
            raise error(file, f"tensor {name!r}: read {len(data)} of {length} bytes: the "
                              "object is shorter than when it was opened; add the model again")
        return data

    def config(self) -> dict[str, Any]:
        return self._objects.config(self._root) or (
            self._objects.config(self._checkpoint) if self._root != self._checkpoint else {})


def _kind(files: ObjectFiles, url: str, names: set[str] | None = None) -> str | None:
    """``safetensors``, ``folder``, ``dcp`` or ``pickles`` for a checkpoint at ``url``."""
    if split(url)[1].endswith(".safetensors"):
        return "safetensors"
    names = files.names(url) if names is None else names
    if any(m in names for m in FOLDER_MARKERS):
        return "folder"
    if METADATA in names or (INNER[0] in names and METADATA in files.names(
            files.inside(url, INNER[0]))):
        return "dcp"
    return "pickles" if any(m in names for m in PICKLES) else None


def open_url(url: str, storage_options: Mapping[str, Any] | None = None,
             prefix: str | None = None) -> CheckpointReader:
    """The reader of the checkpoint at ``url`` (``prefix``: a DCP checkpoint's, as the
    local reader takes it)."""
    url = checked_url(url)
    files = ObjectFiles.of(url, storage_options)
    names = set() if url.endswith(".safetensors") else files.names(url)
    kind = _kind(files, url, names)
    if kind == "safetensors":
        reader: Any = ObjectSafetensorsReader(url, files)
        return wrap(reader, reader.tensor_files(), url)
    if kind == "folder":
        reader = ObjectFolderReader(url, files, names)
        return wrap(reader, reader.tensor_files(), url)
    if kind == "dcp":
        return ObjectDcpReader(url, files, names, prefix)
    if kind == "pickles":
        raise error(url, "a folder of torch pickle files (pytorch_model.bin): not read from "
                         "object storage (unpickling needs the whole file); save the weights "
                         "as safetensors, or copy the folder and read it locally")
    if not names:
        files.stat(url)  # says what is wrong: no such object, bucket, or no access
    raise error(url, "no checkpoint here: give a .safetensors object, a folder holding "
                     "model.safetensors or model.safetensors.index.json with its shards, or "
                     "a torch.distributed.checkpoint folder (.metadata)")


def stat(url: str, storage_options: Mapping[str, Any] | None = None,
         **_format_options: Any) -> tuple[int, str]:
    """(size, version tag) of the object at ``url`` now."""
    return ObjectFiles.of(url, storage_options).stat(url)


def checkpoint_urls(pattern: str, storage_options: Mapping[str, Any] | None = None,
                    **_format_options: Any) -> list[str]:
    """The checkpoints a URL pattern names: a glob's matches (``*``, ``?``, ``[...]``), a
    checkpoint, or the checkpoints directly under a prefix; sorted by name."""
    checked_url(pattern)
    files = ObjectFiles.of(pattern, storage_options)
    scheme, path = split(pattern)
    if any(c in path for c in "*?["):
        matches = sorted(files.call(pattern, lambda: files.fs.glob(path)))
        found = [f"{scheme}://{str(m).rstrip('/')}" for m in matches]
    else:
        found = [f"{scheme}://{path}"]
    out = []
    for url in found:
        if _kind(files, url) in ("safetensors", "folder", "dcp"):
            out.append(url)
        elif not url.endswith(".safetensors"):
            out += [files.inside(url, n) for n in sorted(files.names(url))
                    if _kind(files, files.inside(url, n)) in ("safetensors", "folder", "dcp")]
    return out
