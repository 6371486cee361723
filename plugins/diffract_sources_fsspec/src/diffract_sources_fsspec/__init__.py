"""Checkpoints read in place from object storage through fsspec (the ``objects`` model
format): ``s3://``, ``gs://``, ``hf://`` and the other stores fsspec knows."""

from diffract_sources_fsspec.objects import ObjectFiles, checkpoint_urls, open_url

__all__ = ["ObjectFiles", "checkpoint_urls", "open_url"]
