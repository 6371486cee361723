"""Diffract inside training: weight spectra at a cadence, in the background.

``Monitor`` is the engine (plain loops, accelerate); ``DiffractCallback`` is it as a
Hugging Face ``TrainerCallback``, ``DiffractLightningCallback`` as a Lightning
``Callback``; ``TempBalance``, ``AlphaDecay`` and ``LayerwiseLR`` set per-module learning
rates or weight decay from the alphas it computes. Importing this package imports none of
transformers, Lightning, TensorBoard or torch: each callback's module loads on first use.
"""

from __future__ import annotations

from typing import Any

from diffract_training.monitor import DEFAULT_METRICS, VIEW_METRICS, Monitor, tag
from diffract_training.schedules import AlphaDecay, LayerwiseLR, TempBalance

__all__ = ["DEFAULT_METRICS", "VIEW_METRICS", "AlphaDecay", "DiffractCallback",
           "DiffractLightningCallback", "LayerwiseLR", "Monitor", "TempBalance", "tag"]


def __getattr__(name: str) -> Any:
    if name == "DiffractCallback":
        from diffract_training.hf import DiffractCallback

        return DiffractCallback
    if name == "DiffractLightningCallback":
        from diffract_training.lightning import DiffractLightningCallback

        return DiffractLightningCallback
    raise AttributeError(f"module 'diffract_training' has no attribute {name!r}")
