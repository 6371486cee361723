"""Hook implementation: the ``objects`` model format (imports fsspec only when a URL is
read)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from diffract.plugins import ModelFormat, hookimpl

#: The schemes read in place (the packages they need are named when missing).
SCHEMES = ("s3", "s3a", "gs", "gcs", "hf", "az", "abfs")


def _open(url: str, storage_options: dict[str, Any] | None = None,
          prefix: str | None = None) -> Any:
    from diffract_sources_fsspec.objects import open_url

    return open_url(url, storage_options, prefix)


def _stat(url: str, **options: Any) -> tuple[int, str]:
    from diffract_sources_fsspec.objects import stat

    return stat(url, **options)


def _glob(pattern: str, **options: Any) -> list[str]:
    from diffract_sources_fsspec.objects import checkpoint_urls

    return checkpoint_urls(pattern, **options)


@hookimpl
def diffract_model_formats() -> Iterator[ModelFormat]:
    yield ModelFormat("objects", _open, schemes=SCHEMES, stat=_stat, glob=_glob,
                      description="checkpoints in object storage read in place by byte "
                                  "ranges (safetensors files and folders, DCP) through "
                                  "fsspec")
