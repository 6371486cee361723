"""The database schema, its version, and the migrations from older versions.

``SCHEMA_VERSION`` is written in the ``meta`` table. Opening a store of an older
version runs the migrations in order inside one transaction; a store of a newer version
(written by a newer diffractml-storage-local) is refused with what to do.

History: version 1 kept values without provenance; version 2 adds the ``provenance``
table and each value's producing configuration (``prov``) and commit number (``seq``);
version 3 adds each parameter's type (``ptype``) and metadata (``meta``, JSON).
"""

from __future__ import annotations

import sqlite3

__all__ = ["SCHEMA_VERSION", "create", "migrate", "version_of"]

SCHEMA_VERSION = 3

#: Version 1, kept to test and document the migration path.
V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE models (
    model_id TEXT PRIMARY KEY, position INTEGER NOT NULL, source TEXT NOT NULL,
    copied INTEGER NOT NULL);
CREATE TABLE params (
    model_id TEXT NOT NULL, name TEXT NOT NULL, position INTEGER NOT NULL,
    shape TEXT NOT NULL, dtype TEXT NOT NULL, PRIMARY KEY (model_id, name));
CREATE TABLE weights (
    model_id TEXT NOT NULL, name TEXT NOT NULL, dtype TEXT NOT NULL, kind TEXT NOT NULL,
    blob BLOB, file TEXT, PRIMARY KEY (model_id, name));
CREATE TABLE field_values (
    model_id TEXT NOT NULL, field TEXT NOT NULL, param TEXT NOT NULL, kind TEXT NOT NULL,
    inum INTEGER, num REAL, blob BLOB, file TEXT, nbytes INTEGER NOT NULL,
    PRIMARY KEY (model_id, field, param));
CREATE TABLE aggregates (
    name TEXT PRIMARY KEY, base TEXT NOT NULL, models TEXT NOT NULL, position INTEGER NOT NULL,
    kind TEXT NOT NULL, inum INTEGER, num REAL, blob BLOB, file TEXT, nbytes INTEGER NOT NULL);
CREATE INDEX aggregates_base ON aggregates (base);
CREATE TABLE notes (
    kernel TEXT NOT NULL, models TEXT NOT NULL, param TEXT NOT NULL, kind TEXT NOT NULL,
    reason TEXT NOT NULL, position INTEGER NOT NULL, PRIMARY KEY (kernel, models, param));
"""

#: From version 1 to 2: provenance of every value.
V1_TO_V2 = """
CREATE TABLE provenance (
    id INTEGER PRIMARY KEY, kernel TEXT NOT NULL, provider TEXT NOT NULL,
    config TEXT NOT NULL, UNIQUE (kernel, provider, config));
ALTER TABLE field_values ADD COLUMN prov INTEGER;
ALTER TABLE field_values ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE aggregates ADD COLUMN prov INTEGER;
ALTER TABLE aggregates ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
"""

#: From version 2 to 3: parameter types and metadata.
V2_TO_V3 = """
ALTER TABLE params ADD COLUMN ptype TEXT NOT NULL DEFAULT 'unknown';
ALTER TABLE params ADD COLUMN meta TEXT NOT NULL DEFAULT '[]';
"""

MIGRATIONS = {1: V1_TO_V2, 2: V2_TO_V3}


def version_of(db: sqlite3.Connection) -> int | None:
    """The schema version of an open database, or None when it has no Diffract schema."""
    has_meta = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
    ).fetchone()
    if not has_meta:
        return None
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if not row:
        return None
    text = str(row[0])
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"its schema version is {row[0]!r}, not a version number (1 or more)")
    return int(text)


def _script(db: sqlite3.Connection, script: str) -> None:
    for statement in filter(None, (s.strip() for s in script.split(";"))):
        db.execute(statement)


def create(db: sqlite3.Connection, *, version: int = SCHEMA_VERSION) -> None:
    """Create the schema of ``version`` in an empty database (inside a transaction)."""
    _script(db, V1)
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    migrate(db, 1, version)


def migrate(db: sqlite3.Connection, start: int, stop: int = SCHEMA_VERSION) -> None:
    """Apply the migrations from ``start`` to ``stop`` (inside the caller's transaction)."""
    for version in range(start, stop):
        _script(db, MIGRATIONS[version])
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version + 1),))
