"""The ``local`` store: SQLite (WAL) for the index and small values, ``.npy`` files for
large arrays, one transaction per committed chunk.

Layout of a store directory::

    store.sqlite (+ -wal, -shm)   models, parameters, values, aggregates, notes, provenance
    arrays/ab/<uuid>-<crc32>.npy  arrays over 64 KiB (and large tuples, as .npz); the name
                                  carries the CRC32 of the bytes, checked on every read
    .lock                         held shared by every open store; exclusive for clean-up
    .writers/<pid>-<id>           a process that wrote or deleted array files, until it closes

Atomicity. A commit first writes the new array files (under fresh names, never over an
existing file), then applies every row of the chunk in one SQLite transaction. A crash
before the transaction commits leaves only unreferenced files, which the next store to
open the directory alone deletes (it looks only when a writer left its marker in
``.writers/``); a crash after it leaves a complete chunk. Files a
commit replaced or erased are deleted after the transaction.

Durability. ``sync="normal"`` (default) survives a killed process at any point: the OS
keeps what was written. ``sync="full"`` also survives a power failure (SQLite
``synchronous=FULL`` and an fsync of every array file, and of its folder after the
rename that names it, before its row commits), at the
cost of waiting for the disk on every chunk.

Concurrency. Any number of processes may read while one writes (WAL). Writers take
SQLite's write lock per commit and wait up to ``timeout`` seconds for another writer,
then raise :class:`~diffract.errors.StorageError`; the store is never left half-written.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from diffract.errors import DuplicateModelError, ModelSourceError, StorageError
from diffract.plugins import (
    Batch,
    ModelSource,
    Note,
    ParamInfo,
    Provenance,
    Stamp,
    Store,
    WeightsUnavailableError,
    open_model_source,
    rename_in_contextual,
    split_contextual,
)
from diffract_storage_local._directory import DB_NAME, StoreDirectory

__all__ = ["DB_NAME", "LocalStore"]

_VALUE_COLUMNS = "kind, inum, num, blob, file"


def _weights_of(value: Any) -> tuple[np.ndarray, str]:
    """A parameter as a numpy array to copy, and the dtype to restore (bf16 kept as bits)."""
    if isinstance(value, np.ndarray):
        return value, str(value.dtype)
    t = value.detach().cpu().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if name == "bfloat16":
        import torch

        return t.view(torch.int16).numpy(), name
    return t.numpy(), name


def _restore(array: np.ndarray, dtype: str, *, as_tensor: bool) -> Any:
    """A copied parameter back: as its original tensor (when torch is there) or numpy."""
    if dtype == "bfloat16":
        if as_tensor and "torch" in sys.modules:
            import torch

            return torch.from_numpy(np.array(array)).view(torch.bfloat16)
        bits = np.asarray(array).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    if as_tensor and "torch" in sys.modules and dtype.startswith("float"):
        import torch

        return torch.from_numpy(np.array(array))
    return array.astype(np.float32) if array.dtype.itemsize < 4 else array


def _storage_errors(cls: type) -> type:
    """Every public method of the store reports SQLite's errors (a database corrupted
    after it was opened, a disk I/O error) as StorageError, with what to do."""
    import functools

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except sqlite3.DatabaseError as exc:
                raise StorageError(self._db_problem(exc)) from None
        return call

    for owner in (StoreDirectory, cls):
        for name, member in list(vars(owner).items()):
            if not name.startswith("_") and callable(member):
                setattr(cls, name, wrap(member))
    return cls


@_storage_errors
class LocalStore(StoreDirectory, Store):
    """A durable store in a directory; see the module docstring."""

    durable = True

    # -- models ---------------------------------------------------------------------------
    def add_model(self, model_id: str, params: Sequence[ParamInfo], source: ModelSource,
                  load: Callable[[str], np.ndarray],
                  load_raw: Callable[[str], Any] | None = None, *,
                  copy_weights: bool = True) -> None:
        raw = load_raw or load
        copy = copy_weights and not source.is_file_backed
        written: list[str] = []
        rows = []
        try:
            if copy:  # before the transaction: reading may be slow, writing files too
                for info in params:
                    try:
                        value = raw(info.name)
                    except ModelSourceError:  # no data (a meta tensor): as in the ram
                        continue  # profile, its units fail with the reason when applied
                    array, dtype = _weights_of(value)
                    kind, _, _, blob, path, _ = self._encode(np.ascontiguousarray(array), written)
                    rows.append((model_id, info.name, dtype, kind, blob, path))
            with self._transaction() as db:
                if db.execute("SELECT 1 FROM models WHERE model_id = ?", (model_id,)).fetchone():
                    # another process committed it since the session checked: a duplicate
                    raise DuplicateModelError(f"Model {model_id!r} is already in the store at "
                                              f"{str(self.root)!r} (another process added "
                                              "it).", model_id=model_id)
                position = db.execute(
                    "SELECT COALESCE(MAX(position), 0) + 1 FROM models").fetchone()[0]
                db.execute("INSERT INTO models VALUES (?, ?, ?, ?)",
                           (model_id, position, source.to_json(), int(copy)))
                db.executemany("INSERT INTO params VALUES (?, ?, ?, ?, ?, ?, ?)", [
                    (model_id, p.name, i, json.dumps(list(p.shape)), p.dtype, p.ptype,
                     json.dumps([list(kv) for kv in p.meta]))
                    for i, p in enumerate(params)
                ])
                db.executemany("INSERT INTO weights VALUES (?, ?, ?, ?, ?, ?)", rows)
        except BaseException:
            self._unlink(written)
            raise
        self._loaders[model_id] = (load, raw)
        self._params[model_id] = list(params)

    def model_ids(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self.db.execute("SELECT model_id FROM models ORDER BY position")]

    def params(self, model_id: str) -> list[ParamInfo]:
        if model_id not in self._params:  # a model's parameters never change
            with self._lock:
                rows = self.db.execute(
                    "SELECT name, shape, dtype, ptype, meta FROM params WHERE model_id = ? "
                    "ORDER BY position", (model_id,)).fetchall()
            if not rows and model_id not in self.model_ids():
                raise KeyError(model_id)
            self._params[model_id] = [
                ParamInfo(model_id, name, tuple(json.loads(shape)), dtype, ptype,
                          tuple(tuple(kv) for kv in json.loads(meta)))
                for name, shape, dtype, ptype, meta in rows
            ]
        return list(self._params[model_id])

    def source(self, model_id: str) -> ModelSource:
        with self._lock:
            row = self.db.execute("SELECT source FROM models WHERE model_id = ?",
                                  (model_id,)).fetchone()
        if row is None:
            raise KeyError(model_id)
        return ModelSource.from_json(row[0])

    def _model_loaders(self, model_id: str) -> tuple[Callable[[str], Any], Callable[[str], Any]]:
        if model_id in self._loaders:
            return self._loaders[model_id]
        source = self.source(model_id)
        if source.is_file_backed:
            loaders = open_model_source(source, model_id)
        else:
            with self._lock:
                copied = self.db.execute("SELECT copied FROM models WHERE model_id = ?",
                                         (model_id,)).fetchone()[0]
            if copied:
                loaders = (lambda name: self._copied(model_id, name, as_tensor=False),
                           lambda name: self._copied(model_id, name, as_tensor=True))
            else:
                def gone(name: str) -> Any:
                    raise WeightsUnavailableError(
                        f"the weights of in-memory model {model_id!r} were not copied into "
                        "the store (copy_weights=False) and are gone since the session that "
                        "added them closed; add the model again to compute fields that need "
                        "its weights",
                        model_id=model_id,
                    )

                loaders = (gone, gone)
        self._loaders[model_id] = loaders
        return loaders

    def _copied(self, model_id: str, name: str, *, as_tensor: bool) -> Any:
        with self._lock:
            row = self.db.execute("SELECT dtype, kind, blob, file FROM weights WHERE "
                                  "model_id = ? AND name = ?", (model_id, name)).fetchone()
        if row is None:
            if name not in {p.name for p in self.params(model_id)}:
                raise KeyError((model_id, name))
            raise WeightsUnavailableError(
                f"parameter {name!r} of in-memory model {model_id!r} had no data when it was "
                "added (a meta tensor?), so no copy of it was stored; add the model again "
                "with real weights to compute fields that need them", model_id=model_id)
        dtype, kind, blob, file = row
        array = self._decode((kind, None, None, blob, file), f"weights of {model_id}/{name}")
        return _restore(array, dtype, as_tensor=as_tensor)

    def load_weights(self, model_id: str, param: str) -> np.ndarray:
        return self._model_loaders(model_id)[0](param)

    def load_tensor(self, model_id: str, param: str) -> Any:
        return self._model_loaders(model_id)[1](param)

    # -- per-parameter fields -------------------------------------------------------------
    def present(self, model_id: str, field: str) -> set[str]:
        with self._lock:
            return {r[0] for r in self.db.execute(
                "SELECT param FROM field_values WHERE model_id = ? AND field = ?",
                (model_id, field))}

    def read(self, model_id: str, param: str, field: str) -> Any:
        for _attempt in range(2):  # a concurrent writer may replace the row and its file
            with self._lock:
                row = self.db.execute(
                    f"SELECT {_VALUE_COLUMNS} FROM field_values "  # noqa: S608
                    "WHERE model_id = ? AND field = ? AND param = ?",
                    (model_id, field, param)).fetchone()
            if row is None:
                raise KeyError((model_id, param, field))
            try:
                return self._decode(row, f"field {field!r} of {model_id}/{param}")
            except StorageError:
                if _attempt:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def read_field(self, model_id: str, field: str) -> dict[str, Any]:
        """One query for every parameter's value (a row a concurrent writer replaced
        while it was decoded is read again alone)."""
        with self._lock:
            rows = self.db.execute(
                f"SELECT param, {_VALUE_COLUMNS} FROM field_values "  # noqa: S608
                "WHERE model_id = ? AND field = ?", (model_id, field)).fetchall()
        out = {}
        for param, *row in rows:
            try:
                out[param] = self._decode(row, f"field {field!r} of {model_id}/{param}")
            except StorageError:
                out[param] = self.read(model_id, param, field)
        return out

    def nbytes(self, model_id: str, param: str, field: str) -> int:
        with self._lock:
            row = self.db.execute(
                "SELECT nbytes FROM field_values WHERE model_id = ? AND field = ? AND param = ?",
                (model_id, field, param)).fetchone()
        return int(row[0]) if row else 0

    def fields(self, model_id: str) -> set[str]:
        with self._lock:
            return {r[0] for r in self.db.execute(
                "SELECT DISTINCT field FROM field_values WHERE model_id = ?", (model_id,))}

    # -- aggregates -----------------------------------------------------------------------
    def aggregate_names(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self.db.execute("SELECT name FROM aggregates ORDER BY position")]

    def read_aggregate(self, name: str) -> Any:
        with self._lock:
            row = self.db.execute(f"SELECT {_VALUE_COLUMNS} FROM aggregates WHERE name = ?",  # noqa: S608
                                  (name,)).fetchone()
        if row is None:
            raise KeyError(name)
        return self._decode(row, f"aggregate {name!r}")

    def has_aggregate(self, name: str) -> bool:
        with self._lock:
            return self.db.execute("SELECT 1 FROM aggregates WHERE name = ?",
                                   (name,)).fetchone() is not None

    # -- provenance -----------------------------------------------------------------------
    def stamps(self, model_id: str, field: str) -> dict[str, Stamp]:
        with self._lock:
            rows = self.db.execute(
                "SELECT v.param, p.kernel, p.provider, p.config, v.seq FROM field_values v "
                "JOIN provenance p ON p.id = v.prov WHERE v.model_id = ? AND v.field = ?",
                (model_id, field)).fetchall()
        return {param: Stamp(Provenance(k, prov, cfg), seq) for param, k, prov, cfg, seq in rows}

    def aggregate_stamp(self, name: str) -> Stamp | None:
        with self._lock:
            row = self.db.execute(
                "SELECT p.kernel, p.provider, p.config, a.seq FROM aggregates a "
                "JOIN provenance p ON p.id = a.prov WHERE a.name = ?", (name,)).fetchone()
        return Stamp(Provenance(*row[:3]), row[3]) if row else None

    # -- notes ----------------------------------------------------------------------------
    def notes(self) -> list[Note]:
        with self._lock:
            rows = self.db.execute("SELECT kernel, models, param, kind, reason FROM notes "
                                   "ORDER BY position").fetchall()
        return [Note(k, tuple(m.split(",")), p or None, kind, reason)
                for k, m, p, kind, reason in rows]

    # -- writes ---------------------------------------------------------------------------
    def _provenance_id(self, db: sqlite3.Connection, prov: Provenance) -> int:
        db.execute("INSERT OR IGNORE INTO provenance (kernel, provider, config) VALUES (?, ?, ?)",
                   (prov.kernel, prov.provider, prov.config))
        return db.execute("SELECT id FROM provenance WHERE kernel = ? AND provider = ? AND "
                          "config = ?", (prov.kernel, prov.provider, prov.config)).fetchone()[0]

    def commit(self, batch: Batch) -> None:
        known = set(self.model_ids())
        unknown = sorted({m for m, _, _ in batch.values} - known)
        if unknown:  # before anything is written
            raise KeyError(f"commit names unknown model(s) {unknown}")
        written: list[str] = []
        replaced: list[str] = []
        try:
            values = [(key, self._encode(v, written)) for key, v in batch.values.items()]
            aggregates = [(name, self._encode(v, written)) for name, v in batch.aggregates.items()]
            with self._lock, self._transaction() as db:
                last = db.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()
                seq = int(last[0]) + 1 if last else 1
                db.execute("INSERT OR REPLACE INTO meta VALUES ('seq', ?)", (str(seq),))
                provs = {f: self._provenance_id(db, p) for f, p in batch.provenance.items()}
                for (model_id, param, field), enc in values:
                    old = db.execute("SELECT file FROM field_values WHERE model_id = ? AND "
                                     "field = ? AND param = ?", (model_id, field, param)).fetchone()
                    if old and old[0]:
                        replaced.append(old[0])
                    db.execute(
                        "INSERT OR REPLACE INTO field_values VALUES "
                        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (model_id, field, param, *enc, provs.get(field), seq))
                for name, enc in aggregates:
                    base, models, _ = split_contextual(name)
                    old = db.execute("SELECT file, position FROM aggregates WHERE name = ?",
                                     (name,)).fetchone()
                    if old and old[0]:
                        replaced.append(old[0])
                    position = old[1] if old else db.execute(
                        "SELECT COALESCE(MAX(position), 0) + 1 FROM aggregates").fetchone()[0]
                    db.execute(
                        "INSERT OR REPLACE INTO aggregates (name, base, models, position, kind, "
                        "inum, num, blob, file, nbytes, prov, seq) VALUES "
                        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (name, base, ",".join(models), position, *enc, provs.get(base), seq))
                for kernel, models, param in batch.cleared_notes:
                    db.execute("DELETE FROM notes WHERE kernel = ? AND models = ? AND param = ?",
                               (kernel, ",".join(models), param or ""))
                for note in batch.notes:
                    key = (note.kernel, ",".join(note.models), note.param or "")
                    old = db.execute("SELECT position FROM notes WHERE kernel = ? AND models = ? "
                                     "AND param = ?", key).fetchone()
                    position = old[0] if old else db.execute(
                        "SELECT COALESCE(MAX(position), 0) + 1 FROM notes").fetchone()[0]
                    db.execute("INSERT OR REPLACE INTO notes VALUES (?, ?, ?, ?, ?, ?)",
                               (*key, note.kind, note.reason, position))
        except BaseException:
            self._unlink(written)
            raise
        self._unlink(replaced)

    def erase_values(self, values: Iterable[tuple[str, str, str]], aggregates: Iterable[str] = (),
                     notes: Iterable[tuple[str, tuple[str, ...], str | None]] = ()) -> int:
        gone: list[str] = []
        erased = 0
        with self._lock, self._transaction() as db:
            for model_id, param, field in values:
                row = db.execute("SELECT file FROM field_values WHERE model_id = ? AND "
                                 "field = ? AND param = ?", (model_id, field, param)).fetchone()
                if row is None:
                    continue
                erased += 1
                if row[0]:
                    gone.append(row[0])
                db.execute("DELETE FROM field_values WHERE model_id = ? AND field = ? AND "
                           "param = ?", (model_id, field, param))
            for name in aggregates:
                row = db.execute("SELECT file FROM aggregates WHERE name = ?", (name,)).fetchone()
                if row is None:
                    continue
                erased += 1
                if row[0]:
                    gone.append(row[0])
                db.execute("DELETE FROM aggregates WHERE name = ?", (name,))
            for kernel, models, param in notes:
                db.execute("DELETE FROM notes WHERE kernel = ? AND models = ? AND param = ?",
                           (kernel, ",".join(models), param or ""))
        self._unlink(gone)
        return erased

    def rename_model(self, old: str, new: str) -> None:
        with self._lock, self._transaction() as db:
            if db.execute("SELECT 1 FROM models WHERE model_id = ?", (new,)).fetchone():
                raise KeyError(f"model {new!r} exists")
            for table in ("models", "params", "weights", "field_values"):
                db.execute(f"UPDATE {table} SET model_id = ? WHERE model_id = ?",  # noqa: S608
                           (new, old))
            for name, models_text in db.execute("SELECT name, models FROM aggregates").fetchall():
                models = models_text.split(",")
                if old in models:
                    renamed = rename_in_contextual(name, old, new)
                    db.execute("UPDATE aggregates SET name = ?, models = ? WHERE name = ?",
                               (renamed, ",".join(new if m == old else m for m in models), name))
            for kernel, models_text, param in db.execute(
                    "SELECT kernel, models, param FROM notes").fetchall():
                models = models_text.split(",")
                if old in models:
                    db.execute("UPDATE notes SET models = ? WHERE kernel = ? AND models = ? AND "
                               "param = ?", (",".join(new if m == old else m for m in models),
                                             kernel, models_text, param))
        if old in self._loaders:
            self._loaders[new] = self._loaders.pop(old)
        self._params.pop(old, None)

    def erase_model(self, model_id: str) -> None:
        gone: list[str] = []
        with self._lock, self._transaction() as db:
            for table in ("weights", "field_values"):
                gone += [r[0] for r in db.execute(
                    f"SELECT file FROM {table} WHERE model_id = ? AND file IS NOT NULL",  # noqa: S608
                    (model_id,))]
            for table in ("models", "params", "weights", "field_values"):
                db.execute(f"DELETE FROM {table} WHERE model_id = ?", (model_id,))  # noqa: S608
            for name, models_text, file in db.execute(
                    "SELECT name, models, file FROM aggregates").fetchall():
                if model_id in models_text.split(","):
                    db.execute("DELETE FROM aggregates WHERE name = ?", (name,))
                    if file:
                        gone.append(file)
            for kernel, models_text, param in db.execute(
                    "SELECT kernel, models, param FROM notes").fetchall():
                if model_id in models_text.split(","):
                    db.execute("DELETE FROM notes WHERE kernel = ? AND models = ? AND param = ?",
                               (kernel, models_text, param))
        self._loaders.pop(model_id, None)
        self._params.pop(model_id, None)
        self._unlink(gone)

    def erase(self, fields: Iterable[str], model_ids: Iterable[str],
              kernels: Iterable[str] = ()) -> int:
        fields, models, kernels = set(fields), set(model_ids), set(kernels)
        gone: list[str] = []
        erased = 0
        with self._lock, self._transaction() as db:
            for model_id in models:
                for field in fields:
                    rows = db.execute("SELECT file FROM field_values WHERE model_id = ? AND "
                                      "field = ?", (model_id, field)).fetchall()
                    gone += [r[0] for r in rows if r[0]]
                    erased += len(rows)
                    db.execute("DELETE FROM field_values WHERE model_id = ? AND field = ?",
                               (model_id, field))
            for name, models_text, file in db.execute(
                    "SELECT name, models, file FROM aggregates").fetchall():
                base = split_contextual(name)[0]
                ctx = set(models_text.split(",")) if models_text else set()
                if base in fields and ctx and ctx <= models:
                    db.execute("DELETE FROM aggregates WHERE name = ?", (name,))
                    erased += 1
                    if file:
                        gone.append(file)
            for kernel, models_text, param in db.execute(
                    "SELECT kernel, models, param FROM notes").fetchall():
                if kernel in kernels and set(models_text.split(",")) <= models:
                    db.execute("DELETE FROM notes WHERE kernel = ? AND models = ? AND param = ?",
                               (kernel, models_text, param))
        self._unlink(gone)
        return erased
