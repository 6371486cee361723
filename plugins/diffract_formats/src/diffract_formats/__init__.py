"""Diffract's model formats: safetensors, torch state-dict files, ``.npz`` and Hugging
Face-style checkpoint directories (see :mod:`diffract_formats.readers`).

Installed, they are found through the ``diffract`` entry points; ``session.models.add``
and ``diffract analyze`` pick one per path.
"""

__version__ = "0.2.0"

__all__ = ["__version__"]
