"""Hugging Face model ids (``org/name``, ``org/name@revision``) found in the local cache,
offline: nothing is downloaded.

The cache is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub`` (``~/.cache/huggingface/hub``), read when the id is
looked up (not when a library was imported). With huggingface_hub installed its own
``snapshot_download(local_files_only=True)`` finds the snapshot; without it the cache's
layout is read as huggingface_hub writes it: ``models--org--name/refs/<revision>`` holds a
commit, ``snapshots/<commit>/`` the files (links into ``blobs/``, which the Hugging Face
reader follows for a cache snapshot).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from diffract_formats._common import error

__all__ = ["cache_dir", "locate"]

#: ``org/name`` with an optional ``@revision`` (a branch, a tag or a commit).
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96})(?:@(?P<rev>[\w./-]{1,200}))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")


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
    no model id; a ModelSourceError saying how to fetch it when it is not cached."""
    found = HUB_ID.fullmatch(name)
    if found is None or ".." in name or "//" in name:
        return None
    repo, revision = found["repo"], found["rev"] or "main"
    cache = cache_dir()
    snapshot = _with_hub(repo, revision, cache) if _hub_available() else _by_layout(
        repo, revision, cache)
    if snapshot is None:
        fetch = f"hf download {repo}" + (f" --revision {revision}" if found["rev"] else "")
        raise error(cache, f"{name!r} is no file or folder here, and model {repo!r} "
                           f"(revision {revision}) is not in the local Hugging Face cache: "
                           f"fetch it with `{fetch}` (Diffract downloads nothing), set "
                           "HF_HUB_CACHE or HF_HOME to the cache that holds it, or give a "
                           "path")
    return str(snapshot)


def _hub_available() -> bool:
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        return False
    return True


def _with_hub(repo: str, revision: str, cache: Path) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, revision=revision, cache_dir=str(cache),
                                      local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (its own LocalEntryNotFoundError), or no id
        return None


def _by_layout(repo: str, revision: str, cache: Path) -> Path | None:
    folder = cache / ("models--" + repo.replace("/", "--"))
    commit = revision
    if not _COMMIT.fullmatch(revision):
        ref = folder / "refs" / revision
        if not ref.is_file():
            return None
        with open(ref, "rb") as fh:
            commit = fh.read(100).decode("ascii", errors="replace").strip()
        if not _COMMIT.fullmatch(commit):
            return None
    snapshot = folder / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None
