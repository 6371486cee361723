"""The directory of a ``local`` store: its SQLite connection (opened, checked, migrated,
closed), the advisory lock every open store holds, clean-up of orphaned array files, and
the array files themselves (written under fresh names, read back, removed)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from diffract.errors import StorageError
from diffract.plugins import ParamInfo
from diffract_storage_local import _codec, _schema

try:  # advisory file locks (POSIX); elsewhere orphan clean-up is skipped
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = ["DB_NAME", "StoreDirectory"]

DB_NAME = "store.sqlite"


#: Markers of processes that may have left unreferenced array files (see _clean_orphans).
WRITERS = ".writers"
#: Present once the store's files have been scanned under the marker protocol.
TRACKED = ".orphans-scanned"


def _files_under(root: Path, folder: str) -> Iterator[str]:
    """Every file below ``root / folder``, as a path relative to ``root`` (os.scandir:
    no stat per file, no Path per file)."""
    stack = [folder]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(root / rel))
        except OSError:
            continue
        for entry in entries:
            child = f"{rel}/{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                stack.append(child)
            else:
                yield child


class StoreDirectory:
    """A store's directory, database and array files (the storage half of LocalStore)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, timeout: float = 30.0,
                 sync: str = "normal", read_only: bool | None = None) -> None:
        if sync not in ("normal", "full"):
            raise StorageError(f"sync must be 'normal' or 'full', got {sync!r}.")
        if read_only not in (None, True, False):
            raise StorageError(f"read_only must be True, False or None (decide from the "
                               f"directory's permissions), got {read_only!r}.")
        self.root = Path(path if path is not None else ".diffract").expanduser().resolve()
        self.timeout = float(timeout)
        self.sync = sync
        #: None: read-only when the directory or database cannot be written.
        self._want_read_only = read_only
        self.read_only = bool(read_only)
        self._why_read_only = "opened with read_only=True"
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._lockfile: Any = None
        self._loaders: dict[str, tuple[Callable[[str], Any], Callable[[str], Any]]] = {}
        self._params: dict[str, list[ParamInfo]] = {}
        self._marker: Path | None = None
        self._open()

    # -- opening and closing ----------------------------------------------------------
    def _unwritable(self) -> str | None:
        """Why an existing store cannot be written (a read-only file system, missing
        permissions), or None when it can."""
        for place in (self.root, self.root / DB_NAME):
            if not os.access(place, os.W_OK):
                what = "directory" if place == self.root else "database"
                return f"its {what} cannot be written by this user or on this file system"
        return None

    def _check_directory(self) -> None:
        root = self.root
        if root.exists() and not root.is_dir():
            raise StorageError(
                f"{str(root)!r} is a file, not a Diffract store directory. Pass a directory "
                "(new or holding a store) as path=."
            )
        exists = (root / DB_NAME).is_file()
        self._fresh = not exists  # no store was here: one left empty at close is said
        if self._want_read_only is None and exists:
            why = self._unwritable()
            if why is not None:
                self.read_only, self._why_read_only = True, why
        if self.read_only:
            if not exists:
                raise StorageError(
                    f"There is no Diffract store at {str(root)!r} to open read-only (no "
                    f"{DB_NAME}). Check the path, or open it writable to create one.")
            return
        if root.is_dir() and not (root / DB_NAME).exists():
            known = (".lock", "arrays", WRITERS, TRACKED)
            others = [p.name for p in root.iterdir() if p.name not in known]
            if others:
                raise StorageError(
                    f"{str(root)!r} is not a Diffract store (it has no {DB_NAME} but holds "
                    f"{sorted(others)[:5]}). Choose a new or empty directory for the store."
                )
        try:
            (root / "arrays").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"Cannot create the store at {str(root)!r}: {exc.strerror or exc}. Choose a "
                "writable location (path=...)."
            ) from None

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.root / DB_NAME, timeout=self.timeout,
                                 isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={'FULL' if self.sync == 'full' else 'NORMAL'}")
            db.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
        except sqlite3.DatabaseError as exc:
            raise StorageError(self._db_problem(exc)) from None
        return db

    def _db_problem(self, exc: Exception) -> str:
        text = str(exc)
        if "not a database" in text or "malformed" in text:
            return (f"{str(self.root / DB_NAME)!r} is corrupt or not a Diffract store "
                    f"({text}). Restore it from a copy, or move it away and start a new store.")
        if "readonly" in text or "read-only" in text or "unable to open" in text:
            return (f"Cannot write the store at {str(self.root)!r} ({text}). Check the "
                    "directory's permissions, or choose a writable location.")
        if "locked" in text or "busy" in text:
            return (f"The store at {str(self.root)!r} is locked by another writer for more "
                    f"than {self.timeout:g} s ({text}). Wait for it to finish, or open the "
                    "store with a longer timeout=.")
        return f"The store at {str(self.root)!r} failed: {text}."

    def _connect_read_only(self) -> sqlite3.Connection:
        """A read-only connection. A WAL database wants its ``-shm`` file, which cannot be
        made in a directory nobody may write: then it is opened as immutable (a store in
        such a directory has no writer to race)."""
        from urllib.parse import quote

        uri = f"file:{quote(str(self.root / DB_NAME))}?mode=ro"
        for extra in ("", "&immutable=1"):
            try:
                db = sqlite3.connect(uri + extra, uri=True, timeout=self.timeout,
                                     isolation_level=None, check_same_thread=False)
                db.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
                return db
            except sqlite3.DatabaseError as exc:
                with contextlib.suppress(UnboundLocalError, sqlite3.Error):
                    db.close()
                if extra or "unable to open" not in str(exc):
                    raise StorageError(self._db_problem(exc)) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _version(self, db: sqlite3.Connection) -> int | None:
        try:
            return _schema.version_of(db)
        except sqlite3.DatabaseError as exc:
            raise StorageError(self._db_problem(exc)) from None
        except ValueError as exc:  # a version that is no schema version
            raise StorageError(
                f"{str(self.root / DB_NAME)!r} is corrupt: {exc}. Restore it from a copy, or "
                "move it away and start a new store.") from None

    def _open_read_only(self) -> None:
        if fcntl is not None and (self.root / ".lock").is_file():
            with contextlib.suppress(OSError):  # a shared lock: a clean-up waits for us
                self._lockfile = open(self.root / ".lock", "rb")  # noqa: SIM115
                fcntl.flock(self._lockfile, fcntl.LOCK_SH)
        db = self._connect_read_only()
        try:
            version = self._version(db)
            if version != _schema.SCHEMA_VERSION:
                newer = version is not None and version > _schema.SCHEMA_VERSION
                raise StorageError(
                    f"The store at {str(self.root)!r} is open read-only ("
                    f"{self._why_read_only}) and " + (
                        f"was written by a newer diffractml-storage-local (schema {version}; "
                        f"this one reads up to {_schema.SCHEMA_VERSION}). Upgrade: pip "
                        "install -U diffractml-storage-local." if newer else
                        f"its schema ({version}) must be migrated to "
                        f"{_schema.SCHEMA_VERSION} first, which needs writing: open it once "
                        "where it can be written."))
        except BaseException:
            db.close()
            self._release_file_lock()
            raise
        self._db = db

    def check_writable(self) -> None:
        if self.read_only:
            raise StorageError(
                f"The store at {str(self.root)!r} is read-only ({self._why_read_only}): "
                "exports, stale() and provenance() work, but nothing can be added, "
                "computed or erased. Copy the directory somewhere writable (or fix its "
                "permissions) and open that.")

    def _open(self) -> None:
        self._check_directory()
        if self.read_only:
            self._open_read_only()
            return
        self._take_file_lock()
        db = self._connect()
        try:
            current = self._version(db)
            if current == _schema.SCHEMA_VERSION:  # the usual case: no write lock needed
                self._db = db
                self._clean_orphans()
                return
            with self._transaction(db):
                version = self._version(db)
                if version is None:
                    tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                    if tables:
                        raise StorageError(
                            f"{str(self.root / DB_NAME)!r} is an SQLite database but not a "
                            "Diffract store. Choose another directory."
                        )
                    _schema.create(db)
                elif version > _schema.SCHEMA_VERSION:
                    raise StorageError(
                        f"The store at {str(self.root)!r} was written by a newer "
                        f"diffractml-storage-local (schema {version}; this one reads up to "
                        f"{_schema.SCHEMA_VERSION}). Upgrade: pip install -U "
                        "diffractml-storage-local."
                    )
                elif version < _schema.SCHEMA_VERSION:
                    _schema.migrate(db, version)
        except BaseException:
            db.close()
            self._release_file_lock()
            raise
        self._db = db
        self._clean_orphans()

    def _take_file_lock(self) -> None:
        if fcntl is None:
            return
        lock = self.root / ".lock"
        if lock.is_dir() or (lock.exists() and not lock.is_file()):
            raise StorageError(
                f"{str(lock)!r} is not a file (a directory or a device), so the store cannot "
                "be locked. Remove it (no data lives there) and open the store again.")
        try:
            self._lockfile = open(lock, "a+b")  # noqa: SIM115 - held while open
        except OSError as exc:
            raise StorageError(
                f"Cannot open the store's lock file {str(lock)!r}: {exc.strerror or exc}. "
                "Check the directory's permissions, or open the store with "
                "read_only=True to export from it.") from None
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._exclusive = True
        except OSError:
            self._exclusive = False
            fcntl.flock(self._lockfile, fcntl.LOCK_SH)

    def _release_file_lock(self) -> None:
        if self._lockfile is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lockfile, fcntl.LOCK_UN)
            self._lockfile.close()
            self._lockfile = None

    def _clean_orphans(self) -> None:
        """Delete array files no row names (a crash between writing them and the commit,
        or between a commit and deleting the files it replaced); only when no other
        process has the store open (they may be mid-commit). A process that writes or
        deletes array files leaves a marker in ``.writers/`` until it closes the store,
        so the scan runs only after one did not close (or on a store from before the
        markers): opening a large store is not a walk over its files."""
        if self._lockfile is None or not getattr(self, "_exclusive", False):
            return
        writers = self.root / WRITERS
        left = list(writers.iterdir()) if writers.is_dir() else []
        if left or not (self.root / TRACKED).exists():
            referenced = set()
            for table in ("field_values", "aggregates", "weights"):
                referenced.update(r[0] for r in self.db.execute(
                    f"SELECT file FROM {table} WHERE file IS NOT NULL"))  # noqa: S608
            for rel in _files_under(self.root, "arrays"):
                if rel not in referenced:
                    with contextlib.suppress(OSError):
                        (self.root / rel).unlink()
            for marker in left:
                with contextlib.suppress(OSError):
                    marker.unlink()
            with contextlib.suppress(OSError):
                (self.root / TRACKED).touch()
        fcntl.flock(self._lockfile, fcntl.LOCK_SH)  # others may open it now
        self._exclusive = False

    def _mark_writing(self) -> None:
        """Leave this process's marker (once per open) before it touches array files."""
        self.check_writable()
        if self._marker is None:
            with self._lock:
                if self._marker is None:
                    marker = self.root / WRITERS / f"{os.getpid()}-{uuid.uuid4().hex}"
                    marker.parent.mkdir(exist_ok=True)
                    marker.touch()
                    self._marker = marker

    @property
    def db(self) -> sqlite3.Connection:
        with self._lock:
            if self._db is None:  # closed, then used again: reopen
                self._open()
            return self._db  # type: ignore[return-value]

    def close(self) -> None:
        with self._lock:
            unused = self._unused()
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._marker is not None:  # every file it wrote is referenced or deleted
                with contextlib.suppress(OSError):
                    self._marker.unlink()
                self._marker = None
            self._release_file_lock()
        if unused:  # a mistyped path read from: say it, at least when the session ends
            from diffract.errors import DiffractWarning, warn

            warn(DiffractWarning(
                f"No store was at {str(self.root)!r} when it was opened, and nothing was "
                "written to it: it is an empty store now. To read a store, check its path "
                "(read_only=True refuses a path that holds none)."))

    def _unused(self) -> bool:
        """Whether this open created the store and nothing was written to it."""
        if not self._fresh or self.read_only or self._db is None:
            return False
        tables = [r[0] for r in self._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'meta'")]
        return not any(self._db.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone()  # noqa: S608
                       for t in tables)

    @contextlib.contextmanager
    def _transaction(self, db: sqlite3.Connection | None = None):
        if self.read_only:
            self.check_writable()
        db = db if db is not None else self.db
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StorageError(self._db_problem(exc)) from None
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        try:
            db.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise StorageError(self._db_problem(exc)) from None

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    # -- array files --------------------------------------------------------------------
    def _write_file(self, enc: _codec.Encoded, suffix: str) -> str:
        """Write a payload under a fresh name that carries its CRC32 (``<uuid>-<crc>``):
        the row names the file and so its checksum, which every read verifies."""
        self._mark_writing()
        name = uuid.uuid4().hex
        folder = self.root / "arrays" / name[:2]
        folder.mkdir(exist_ok=True)
        tmp = folder / f".{name}.tmp"
        try:
            with open(tmp, "wb") as fh:
                crc = enc.write(fh)
                if self.sync == "full":
                    fh.flush()
                    os.fsync(fh.fileno())
            rel = Path("arrays") / name[:2] / f"{name}-{crc:08x}{suffix}"
            os.replace(tmp, self.root / rel)
            if self.sync == "full" and hasattr(os, "O_DIRECTORY"):  # the rename, too
                folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(folder_fd)
                finally:
                    os.close(folder_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise StorageError(
                f"Cannot write an array into the store at {str(self.root)!r}: "
                f"{exc.strerror or exc}. Free some disk space or choose another location; "
                "nothing of this chunk was stored."
            ) from None
        return str(rel)

    def _encode(self, value: Any, written: list[str]) -> tuple[Any, ...]:
        enc = _codec.encode(value)
        path = None
        if enc.to_file:
            path = self._write_file(enc, ".npz" if enc.kind == "T" else ".npy")
            written.append(path)
        return enc.kind, enc.inum, enc.num, enc.blob, path, enc.nbytes

    def _unlink(self, files: Iterable[str | None]) -> None:
        files = [f for f in files if f]
        if files:
            self._mark_writing()
        for rel in files:
            if rel:
                with contextlib.suppress(OSError):
                    (self.root / rel).unlink()

    def _decode(self, row: Sequence[Any], what: str) -> Any:
        kind, inum, num, blob, file = row
        try:
            return _codec.decode(kind, inum, num, blob, str(self.root / file) if file else None)
        except (OSError, ValueError) as exc:
            raise StorageError(
                f"Stored {what} cannot be read from {str(self.root)!r}: {exc}. Erase the "
                "field and apply again to recompute it."
            ) from None
