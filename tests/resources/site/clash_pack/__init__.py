"""A fake plugin whose kernel names collide with the core's and with good_pack's, and
one kernel whose output field collides with a field of good_pack's."""

from diffract.plugins import KernelSpec, hookimpl


def frob_norm(weights):
    """A second frob_norm."""
    return 0.0


def abs_max(weights):
    """A second abs_max."""
    return -1.0


def clash_only(weights):
    """A kernel nobody else provides."""
    return 1.0


def row_max_other(weights):
    """Produces good_pack's field 'row_max' under another kernel name."""
    return 2.0


@hookimpl
def diffract_kernels():
    yield KernelSpec.from_function(frob_norm)
    yield KernelSpec.from_function(abs_max)
    yield KernelSpec.from_function(clash_only)
    yield KernelSpec.from_function(row_max_other, produce_fields=("row_max",))
