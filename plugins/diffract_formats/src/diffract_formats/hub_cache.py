"""Hugging Face model ids (``org/name``, ``org/name@revision``) found in the local cache,
offline: nothing is downloaded.

The cache is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub`` (``~/.cache/huggingface/hub``), read when the id is
looked up (not when a library was imported). The cache's layout is read as
huggingface_hub writes it: ``models--org--name/refs/<revision>`` holds a commit,
``snapshots/<commit>/`` the files (links into ``blobs/``). A revision resolves to a
40-hex commit whose snapshot lies in the repository's folder, by the one rule every
reader keeps (:func:`diffract.plugins.inside`): a ref holding anything but a commit, or a
snapshot linking out of the cache, is refused. huggingface_hub's own
``snapshot_download(local_files_only=True)`` is not used for this: it joins a ref's text
onto ``snapshots/`` unchecked, so a ref holding ``../../..`` leads out of the cache.
A revision may be a unique prefix of a cached commit (``org/name@0123abc``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from diffract.errors import ModelSourceError
from diffract.plugins import inside
from diffract_formats._common import error

__all__ = ["cache_dir", "locate"]

#: ``org/name`` with an optional ``@revision`` (a branch, a tag or a commit).
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96})(?:@(?P<rev>[\w./-]{1,200}))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")
#: A short commit: at least 7 hex digits, as git abbreviates.
_SHORT = re.compile(r"[0-9a-f]{7,39}")


def cache_dir() -> Path:
    """Where huggingface_hub keeps models, from the environment as it is now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "huggingface" / "hub"


def locate(name: str) -> str | None:
    """The snapshot folder of model id ``name`` in the local cache; None when ``name`` is
    no model id; a ModelSourceError saying how to fetch it when it is not cached, or what
    is wrong with the cache."""
    found = HUB_ID.fullmatch(name)
    if found is None or ".." in name or "//" in name:
        return None
    repo, revision = found["repo"], found["rev"] or "main"
    cache = cache_dir()
    snapshot = _snapshot(cache / ("models--" + repo.replace("/", "--")), revision)
    if snapshot is None:
        fetch = f"hf download {repo}" + (f" --revision {revision}" if found["rev"] else "")
        raise error(cache, f"{name!r} is no file or folder here, and model {repo!r} "
                           f"(revision {revision}) is not in the local Hugging Face cache: "
                           f"fetch it with `{fetch}` (Diffract downloads nothing), set "
                           "HF_HUB_CACHE or HF_HOME to the cache that holds it, or give a "
                           "path")
    return str(snapshot)


def _snapshot(folder: Path, revision: str) -> Path | None:
    """``folder/snapshots/<commit>`` of ``revision`` (a ref, a commit or its unique
    prefix), checked inside ``folder``; None when the cache does not hold it."""
    if not folder.is_dir():
        return None
    commit = revision
    if (folder / "refs" / revision).is_file():
        ref = inside(folder, Path("refs") / revision, "fetch the model again")
        with open(ref, "rb") as fh:
            text = fh.read(100).decode("ascii", errors="replace").strip()
        if not _COMMIT.fullmatch(text):
            raise error(folder / "refs" / revision,
                        f"refs/{revision} holds {text[:60]!r}, not a 40-hex commit: the cache "
                        "is damaged (or was not written by huggingface_hub); fetch the model "
                        "again, or give the snapshot's folder as a path")
        commit = text
    elif _SHORT.fullmatch(revision):
        commit = _unique_prefix(folder, revision)
    if not _COMMIT.fullmatch(commit) or not (folder / "snapshots" / commit).is_dir():
        return None
    inside(folder, Path("snapshots") / commit, "fetch the model again")
    return folder / "snapshots" / commit


def _unique_prefix(folder: Path, prefix: str) -> str:
    """The one cached commit starting with ``prefix`` (``prefix`` itself when none does)."""
    snapshots = folder / "snapshots"
    found = sorted(p.name for p in snapshots.iterdir() if p.name.startswith(prefix)
                   and _COMMIT.fullmatch(p.name)) if snapshots.is_dir() else []
    if len(found) > 1:
        raise ModelSourceError(f"revision {prefix!r} is ambiguous in the local Hugging Face "
                               f"cache: {len(found)} commits start with it ({', '.join(found)})"
                               "; give more digits", model_id=None)
    return found[0] if found else prefix
