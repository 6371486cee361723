"""Errors of the spectral pack's fitting functions (part of its public surface).

* :class:`FitError`: the data admit no fit (too few points, no tail, all values equal,
  NaN values). In a session the fields are NaN with the message as the reason.
* :class:`FitArgumentError`: an argument is invalid (an unknown ``fit_method``,
  ``min_tail`` below 2, ``n_replicates`` below 1, data that are not a vector). It is a
  ``ValueError``; in a session it fails the unit (retried once the configuration is
  fixed), never marks it undefined.
* :class:`FitUnavailableError`: the requested method cannot run here (taichi missing or
  failing to start); in a session it fails the unit.
"""

from __future__ import annotations

from diffract.errors import DiffractError, InvalidArgumentError

__all__ = ["FitArgumentError", "FitError", "FitUnavailableError"]


class FitError(DiffractError):
    """The fit is undefined for this data (too few points, no tail, all values equal...)."""


class FitArgumentError(InvalidArgumentError):
    """An argument of a fitting function is invalid; the message lists what is allowed."""


class FitUnavailableError(DiffractError):
    """The requested fit_method cannot run here (taichi missing or failing to start)."""
