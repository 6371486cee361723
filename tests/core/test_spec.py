"""KernelSpec.from_function: metadata from signatures, refusals naming the kernel."""

from __future__ import annotations

import pytest

from diffract import KernelApplyLevel, KernelExecutionProtocol, KernelSpec, Restriction, kernel
from diffract.errors import KernelDefinitionError


class TestFromFunction:
    def test_required_parameters_are_fields_and_defaults_are_config(self):
        """Parameters without defaults are inputs; keyword defaults are configuration."""

        def hard_rank(esd, *, rtol: float = 1e-5) -> int:
            """Rank."""
            return 0

        spec = KernelSpec.from_function(hard_rank)
        assert spec.require_fields == ("esd",)
        assert spec.config_defaults == {"rtol": 1e-5}
        assert spec.produce_fields == ("hard_rank",)
        assert spec.apply_level is KernelApplyLevel.PARAMETER
        assert spec.execution_protocol is KernelExecutionProtocol.SEQUENTIAL
        assert spec.summary == "Rank."

    @pytest.mark.parametrize("sig", ["*args", "**kwargs"])
    def test_star_arguments_are_refused_naming_the_kernel(self, sig):
        """*args and **kwargs raise KernelDefinitionError naming kernel and parameter."""
        ns: dict = {}
        exec(f"def bad(weights, {sig}): return 1", ns)
        with pytest.raises(KernelDefinitionError, match=rf"Kernel 'bad' takes \{sig[:2] if sig.startswith('**') else sig[0]}"):
            KernelSpec.from_function(ns["bad"])

    def test_require_fields_renames_positionally_and_must_match(self):
        """require_fields maps onto required parameters; a count mismatch is refused."""

        def k(a, b, *, c=1):
            return a

        spec = KernelSpec.from_function(k, require_fields=["x", "y"])
        assert spec.inputs == (("a", "x"), ("b", "y"))
        with pytest.raises(KernelDefinitionError, match=r"require_fields \('x',\) has 1 entries but the function has 2"):
            KernelSpec.from_function(k, require_fields=["x"])

    def test_decorator_marks_are_read_and_overridable(self):
        """@kernel marks the function; explicit from_function arguments win."""

        @kernel(produce_fields=("lo", "hi"), restrictions=[Restriction.min_ndim(2)])
        def minmax(weights):
            return 0, 1

        spec = KernelSpec.from_function(minmax)
        assert spec.produce_fields == ("lo", "hi") and len(spec.restrictions) == 1
        assert KernelSpec.from_function(minmax, name="mm2", produce_fields=["a", "b"]).produce_fields == ("a", "b")
        assert minmax(None) == (0, 1)

    def test_parallel_kernel_must_be_picklable(self):
        """A PARALLEL closure is refused with the fix (move it to module level)."""

        def local(weights):
            return 1

        with pytest.raises(KernelDefinitionError, match="cannot be pickled: worker processes need a top-level function"):
            KernelSpec.from_function(local, execution_protocol=KernelExecutionProtocol.PARALLEL)

    @pytest.mark.parametrize("bad", ["a@b", "weights"])
    def test_invalid_or_reserved_produced_fields(self, bad):
        """'@' is reserved for contextual names; 'weights' comes from models.add."""

        def k(frob_norm):
            return 1

        with pytest.raises(KernelDefinitionError, match="Kernel 'k'"):
            KernelSpec.from_function(k, produce_fields=[bad])

    def test_spec_is_frozen_and_repr_summarises_the_function(self):
        """Specs are immutable and their repr names the function without dumping it."""

        def k(weights):
            return 1

        spec = KernelSpec.from_function(k)
        with pytest.raises(AttributeError):
            spec.name = "other"  # type: ignore[misc]
        assert "test_spec.TestFromFunction" in repr(spec) and "function=" in repr(spec)
