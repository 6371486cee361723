"""What a model's weights are: a record a durable store keeps to read them again.

A source is data, not a closure: :class:`ModelSource` says whether the weights live in
files (one checkpoint file, or a Hugging Face-style directory of shards) or in memory
(a torch module, a state dict), and for files records each one's identity
(:class:`FileIdentity`: path, size, modification time and a hash of its header). A
store writes the record as JSON; after a reopen, :func:`diffract.core.models.open_source`
builds the loaders again from it.

Before every read a file's size, modification time, inode and ctime are compared with
the recorded ones (a rewrite with ``touch -r`` still moves the ctime): a file truncated,
rewritten or replaced after it was added is refused with what changed."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import attrs

from diffract.errors import ModelSourceError, install_hint

__all__ = ["FileIdentity", "ModelSource", "HEADER_BYTES", "MAX_SIDE_FILE", "inside",
           "read_json_file", "url_format", "url_scheme"]

#: Bytes hashed at the start of a file (covers a safetensors header for typical models);
#: a safetensors file's whole declared header is hashed when it is longer.
HEADER_BYTES = 1 << 16


#: The most bytes read of a side file (config.json, trainer_state.json, a Keras archive's
#: config) and its deepest nesting: real ones are kilobytes, a few levels deep.
MAX_SIDE_FILE, MAX_JSON_DEPTH = 16 << 20, 100


def url_scheme(path: Any) -> str | None:
    """The scheme of a URL (``s3`` of ``s3://bucket/key``), or None for a local path."""
    found = re.match(r"([a-z][a-z0-9+.-]*)://", str(path)) if isinstance(path, str) else None
    return found.group(1) if found else None


#: The distribution that reads checkpoints in object storage (s3://, gs://, hf://).
OBJECTS_DISTRIBUTION = "diffractml-sources-fsspec"


def url_format(url: str, model_id: str | None, name: str | None = None) -> Any:
    """The format that reads ``url`` in place (its scheme among the format's), the
    highest-priority one, or the one named."""
    from diffract.plugins._runtime import get_catalog

    scheme, formats = url_scheme(url), get_catalog().formats.values()
    found = sorted((f for f in formats if scheme in f.schemes and name in (None, f.name)),
                   key=lambda f: -f.priority)
    if not found:
        raise ModelSourceError(
            f"{f'Model {model_id!r}: ' if model_id else ''}no installed model format "
            f"{f'named {name!r} ' if name else ''}reads {scheme}:// URLs in place (s3://, "
            f"gs://, hf://...: {install_hint(OBJECTS_DISTRIBUTION)}).", model_id=model_id)
    return found[0]


def _object_stat(url: str, options: Any) -> tuple[int, str]:
    """(size, version tag) of an object now, from the format that reads its scheme (given
    the model's format options: where the store is)."""
    return url_format(url, None).stat(url, **dict(options))


def _zip_errors() -> tuple[type[Exception], ...]:
    """zipfile's error, when zipfile is in use (a zip member is only handed over by a
    caller that imported it): not imported for every start."""
    zipfile = sys.modules.get("zipfile")
    return (zipfile.BadZipFile,) if zipfile is not None else ()


def _sha256(data: bytes) -> str:
    """SHA-256 of ``data`` as hex, by CPython's built-in module where there is one
    (hashlib's OpenSSL binding costs 4 ms of every start to import); the same digest."""
    try:
        from _sha2 import sha256  # CPython 3.12+
    except ImportError:
        try:
            from _sha256 import sha256  # CPython 3.11
        except ImportError:
            from hashlib import sha256
    return sha256(data).hexdigest()


def read_json_file(source: Any, what: str | None = None) -> Any:
    """The JSON of a side file (a path, or an open binary file such as a zip member) in
    bounded memory; larger than MAX_SIDE_FILE, not JSON, or nested deeper than
    MAX_JSON_DEPTH: a ModelSourceError naming the file."""
    problem, value = None, None
    try:
        with open(source, "rb") if isinstance(source, (str, os.PathLike)) else source as fh:
            data = fh.read(MAX_SIDE_FILE + 1)
        value = json.loads(data) if len(data) <= MAX_SIDE_FILE else None
        problem = None if len(data) <= MAX_SIDE_FILE else (
            f"is larger than {MAX_SIDE_FILE >> 20} MiB, the most Diffract reads of a side file")
    except (OSError, *_zip_errors()) as exc:
        problem = f"cannot be read ({exc})"
    except (ValueError, RecursionError) as exc:
        problem = f"is not JSON Diffract can read ({type(exc).__name__}: {str(exc)[:100]})"
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack and problem is None:
        node, depth = stack.pop()
        problem = f"nests values deeper than {MAX_JSON_DEPTH} levels" if (
            depth > MAX_JSON_DEPTH) else None
        stack += [(c, depth + 1) for c in (node.values() if isinstance(node, dict) else node)
                  if isinstance(c, (dict, list))]
    if problem is not None:
        raise ModelSourceError(f"{what or str(source)!r} {problem}; fix or remove the file",
                               model_id=None)
    return value


def inside(folder: str | os.PathLike[str], name: str | os.PathLike[str],
           hint: str = "copy the file into the folder") -> Path:
    """``folder / name`` resolved (links followed), when it lies in the checkpoint folder
    ``folder``: the one rule of every reader, for weights and side files alike. A Hugging
    Face cache snapshot (``models--org--name/snapshots/<commit>``) is inside its
    repository's folder, whose ``blobs/`` its files link into; the snapshot folder itself
    must resolve there too. Otherwise a ModelSourceError saying where it leads and ``hint``.
    """
    given = Path(os.path.abspath(folder))
    cached = given.parent.name == "snapshots" and given.parent.parent.name[:8] == "models--"
    area, target = (given.parent.parent if cached else given).resolve(), (given / name).resolve()
    if not target.is_relative_to(area):
        raise ModelSourceError(f"{os.fspath(name)!r} resolves to {str(target)!r}, outside the "
                               f"checkpoint's folder {str(area)!r}: Diffract reads only the "
                               f"checkpoint's own files; {hint}", model_id=None)
    return target


def _header_length(fh: Any, size: int) -> int:
    """Bytes of a file's header worth hashing: a safetensors header in full, else 64 KiB."""
    start = fh.read(8)
    fh.seek(0)
    if len(start) == 8:
        declared = int.from_bytes(start, "little")
        if 0 < declared <= size - 8 and declared < (100 << 20):
            return max(HEADER_BYTES, 8 + declared)
    return HEADER_BYTES


@attrs.frozen
class FileIdentity:
    """One file of a source: where it is, how long, when written, what its header holds."""

    path: str
    size: int
    mtime_ns: int
    header_sha256: str
    #: what ``touch -r`` cannot restore (0: not recorded by an older store)
    inode: int = 0
    ctime_ns: int = 0
    #: an object's ETag or generation (a URL's identity is its size and this tag)
    etag: str = ""

    @classmethod
    def of(cls, path: str | os.PathLike[str], options: Any = ()) -> FileIdentity:
        """The identity of ``path`` now (reads its header; a URL's: asks its store)."""
        if url_scheme(path):
            size, tag = _object_stat(str(path), options)
            return cls(str(path), size, 0, "", etag=tag)
        p = Path(path).resolve()
        st = p.stat()
        with p.open("rb") as fh:
            digest = _sha256(fh.read(_header_length(fh, st.st_size)))
        return cls(str(p), st.st_size, st.st_mtime_ns, digest, st.st_ino, st.st_ctime_ns)

    def change(self, *, full: bool = False, options: Any = ()) -> str | None:
        """What changed since the identity was taken (a phrase), or None.

        By default only size and modification time are compared (a ``stat``, cheap
        before every read); ``full`` also hashes the header again."""
        try:
            if url_scheme(self.path):  # an object: its size and version tag
                size, tag = _object_stat(self.path, options)
                return (f"its size changed from {self.size} to {size} bytes" if size != self.size
                        else None if tag == self.etag else
                        f"it was rewritten (its version tag went from {self.etag} to {tag})")
            st = os.stat(self.path)
        except FileNotFoundError:
            return "it no longer exists"
        except (OSError, ModelSourceError) as exc:
            return f"it cannot be read ({exc})"
        if st.st_size != self.size:
            return f"its size changed from {self.size} to {st.st_size} bytes"
        if st.st_mtime_ns != self.mtime_ns:
            return "it was modified (its modification time changed)"
        if self.inode and st.st_ino != self.inode:
            return "it was replaced by another file (its inode changed)"
        if self.ctime_ns and st.st_ctime_ns != self.ctime_ns:
            return ("it was written to or its status changed (its ctime moved) though its size "
                    "and modification time are as they were")
        if full and FileIdentity.of(self.path).header_sha256 != self.header_sha256:
            return "its header changed"
        return None

    def check(self, model_id: str, *, full: bool = False, options: Any = ()) -> None:
        """Raise :class:`ModelSourceError` when the file changed since it was added."""
        change = self.change(full=full, options=options)
        if change is not None:
            raise ModelSourceError(
                f"Model {model_id!r}: file {self.path!r} changed since the model was added: "
                f"{change}. Restore the file, or add it again under a new model id (the "
                "stored results belong to the old weights).",
                model_id=model_id)


@attrs.frozen
class ModelSource:
    """Where a model's weights are.

    ``kind``: ``file`` (one checkpoint), ``directory`` (a Hugging Face-style checkpoint
    directory: sharded or single-file) or ``memory`` (a torch module or a state dict).
    ``format``: the name of the model format that reads the files; ``files`` their
    identities, in load order; ``path`` the file or directory as given (absolute);
    ``weight_map`` for directories: parameter name -> index into ``files``;
    ``description`` a short human label (``"torch.nn.Sequential"``, ``"state dict"``);
    ``renames`` parameters renamed at add time; ``views`` the views of parameters
    (:mod:`diffract.core.views`), so that a reopened store reads them without their rule."""

    kind: str
    format: str | None = None
    path: str | None = None
    files: tuple[FileIdentity, ...] = ()
    weight_map: tuple[tuple[str, int], ...] = ()
    description: str = ""
    #: (name in the session, name in the files) of parameters renamed at add time
    renames: tuple[tuple[str, str], ...] = ()
    #: what the format's reader was opened with (``models.add(..., key=)``), JSON values
    format_options: tuple[tuple[str, Any], ...] = ()
    #: the checkpoint's place in training (step, tokens, epoch, label; see core.steps)
    step_info: tuple[tuple[str, Any], ...] = ()
    #: (view name, parent name, index, transpose) of each view
    views: tuple[tuple[str, str, tuple[Any, ...], bool], ...] = ()

    @property
    def is_file_backed(self) -> bool:
        return self.kind in ("file", "directory")

    def to_json(self) -> str:
        """The record as JSON (what a durable store keeps)."""
        return json.dumps(attrs.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelSource:
        data = json.loads(text)
        data["files"] = tuple(FileIdentity(**f) for f in data.get("files", ()))
        data["weight_map"] = tuple(tuple(pair) for pair in data.get("weight_map", ()))
        data["renames"] = tuple(tuple(pair) for pair in data.get("renames", ()))
        data["format_options"] = tuple(tuple(pair) for pair in data.get("format_options", ()))
        data["step_info"] = tuple(tuple(pair) for pair in data.get("step_info", ()))
        data["views"] = tuple(
            (name, parent, tuple(i if isinstance(i, int) else tuple(i) for i in index), bool(t))
            for name, parent, index, t in data.get("views", ()))
        return cls(**data)

    def changed_files(self) -> list[str]:
        """``path: what changed`` for every file that differs from its identity."""
        out = []
        for identity in self.files:
            change = identity.change(full=True, options=self.format_options)
            if change is not None:
                out.append(f"{identity.path}: {change}")
        return out
