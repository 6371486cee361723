"""Apply levels and execution protocols of kernels (re-exported by ``execution``)."""

from __future__ import annotations

import enum


class KernelApplyLevel(enum.Enum):
    """Where a kernel runs and where its outputs are stored.

    PARAMETER: once per parameter of each model in scope; outputs stored on the parameter.
    IN_MODEL: once per model; PARAMETER-level inputs arrive as a tuple over the model's
        parameters; outputs stored as ``field@models[m]``.
    CROSS_MODEL: once per parameter name shared by the two models in scope; a
        PARAMETER-level input arrives as a pair ``(value_in_a, value_in_b)``; outputs
        stored as ``field@models[a,b]@params[name]``."""

    PARAMETER = "parameter"
    IN_MODEL = "in_model"
    CROSS_MODEL = "cross_model"


class KernelExecutionProtocol(enum.Enum):
    """How a kernel's units run: in the session's process, or on a worker pool.

    SEQUENTIAL: one after another in the calling process.
    PARALLEL: on the configured process executor; the kernel must be a picklable
        top-level function."""

    SEQUENTIAL = "sequential"
    PARALLEL = "parallel"
