"""Alignment kernels for Diffract (see :mod:`diffract_kernels_alignment.kernels`).

Pairwise: apply them to a pair of models, ``session.filter(model_ids=[a, b])``, or to
many pairs with ``session.compute.apply_pairs``.
"""

__version__ = "0.2.0"

__all__ = ["__version__"]
