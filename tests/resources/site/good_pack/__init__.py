"""A well-behaved fake plugin: one kernel, one storage profile, one executor."""

from diffract.plugins import (
    ExecutorSpec,
    InlineExecutor,
    KernelSpec,
    RamStore,
    StorageProfile,
    hookimpl,
)


def abs_max(weights):
    """Largest absolute entry: ``max |W_ij|``."""
    return float(abs(weights).max())


def row_max(weights):
    """Largest row sum: ``max_i sum_j W_ij``."""
    return float(weights.sum(axis=-1).max())


@hookimpl
def diffract_kernels():
    yield KernelSpec.from_function(abs_max)
    yield KernelSpec.from_function(row_max)


@hookimpl
def diffract_storage_profiles():
    yield StorageProfile("scratch", lambda options: RamStore(), "a second RAM store")


@hookimpl
def diffract_executors():
    yield ExecutorSpec("inline-good", lambda config, options: InlineExecutor())
