"""Where a monitor's values go (sinks, called on the training thread): a callable
``log(values, step)``, a TensorBoard ``SummaryWriter`` (scalars, and each ESD as a
histogram), or the front ends' own."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from diffract.errors import InvalidArgumentError

__all__ = ["Sink", "number", "sinks", "write_histograms"]


def number(value: Any) -> bool:
    """Whether ``value`` is a finite number (a value a tracker can log)."""
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool) \
        and math.isfinite(float(value))


Sink = Callable[[dict[str, float], dict[str, Any], int, Any], None]


def sinks(log_to: Any) -> list[Sink]:
    """The sinks of a monitor's ``log`` argument (one target or a list)."""
    targets = log_to if isinstance(log_to, (list, tuple)) else [log_to] if log_to else []
    out: list[Sink] = []
    for target in targets:
        if hasattr(target, "add_scalar"):
            out.append(_writer_sink(target))
        elif callable(target):
            out.append(lambda values, spectra, step, mon, f=target: f(values, step))
        else:
            raise InvalidArgumentError(
                f"log takes a callable log(values, step), a SummaryWriter (add_scalar) or a "
                f"list of them, got a {type(target).__name__}.")
    return out


def _writer_sink(writer: Any) -> Sink:
    def write(values: dict[str, float], spectra: dict[str, Any], step: int,
              monitor: Any) -> None:
        for name, value in values.items():
            writer.add_scalar(name, value, global_step=step)
        write_histograms(writer, spectra, step, monitor)
        if hasattr(writer, "flush"):
            writer.flush()
    return write


def write_histograms(writer: Any, spectra: dict[str, Any], step: int, monitor: Any) -> None:
    """Each ESD as a histogram of log10 of its nonzero eigenvalues, to a writer with
    ``add_histogram`` (a TensorBoard ``SummaryWriter``), when the monitor logs them."""
    if not monitor.histograms or not hasattr(writer, "add_histogram"):
        return
    for param, esd in spectra.items():
        positive = esd[esd > 0]
        if positive.size:
            writer.add_histogram(f"{monitor.prefix}/esd/{param}", np.log10(positive),
                                 global_step=step)
