"""The error tree: documented, one family for unknown names, ValueErrors for bad arguments."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import diffract.errors as errors
from diffract import Session


def _error_classes():
    return [
        obj for name in errors.__all__
        if inspect.isclass(obj := getattr(errors, name)) and issubclass(obj, errors.DiffractError)
    ]


class TestTree:
    def test_every_public_error_is_in_the_documented_tree(self):
        """Each DiffractError subclass of diffract.errors appears in docs/compute.md's tree,
        under a parent it derives from."""
        import re
        from pathlib import Path

        doc = (Path(__file__).resolve().parents[2] / "docs" / "compute.md").read_text()
        tree = doc.split("## Errors and warnings", 1)[1].split("```text\n", 1)[1]
        tree = tree.split("```", 1)[0]
        drawn, parents = [], {}
        for line in tree.splitlines():
            match = re.match(r"^([│ ├└─]*)(\w+)", line)
            if match is None or match.group(1) and not re.search("[├└]", match.group(1)):
                continue  # a description's second line
            depth = len(match.group(1)) // 4
            drawn.append((depth, match.group(2)))
        stack: list[str] = []
        for depth, name in drawn:
            del stack[depth:]
            if stack:
                parents[name] = stack[-1]
            stack.append(name)
        missing = [cls.__name__ for cls in _error_classes() if cls.__name__ not in
                   {name for _, name in drawn}]
        assert missing == []
        for name, parent in parents.items():
            assert issubclass(getattr(errors, name), getattr(errors, parent)), (name, parent)
        assert len(parents) >= 25

    def test_unknown_names_are_one_family_of_value_errors(self):
        """Every Unknown*Error is an UnknownNameError, hence an InvalidArgumentError and a
        ValueError."""
        unknown = [c for c in _error_classes() if c.__name__.startswith("Unknown")]
        assert len(unknown) == 10
        for cls in unknown:
            assert issubclass(cls, errors.UnknownNameError), cls
            assert issubclass(cls, ValueError), cls

    def test_errors_raised_elsewhere_live_in_diffract_errors(self):
        """ops and the spectral pack raise classes rooted in diffract.errors."""
        from diffract import ops
        from diffract_kernels_spectral import FitArgumentError, FitError, FitUnavailableError

        assert ops.UnknownOpError is errors.UnknownOpError
        for cls in (FitArgumentError, FitError, FitUnavailableError):
            assert issubclass(cls, errors.DiffractError)
        assert issubclass(FitArgumentError, ValueError)
        assert issubclass(errors.ScopeValidationError, errors.FieldError)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda s: s.compute.apply("frob_norm", errors="ignore"), errors.InvalidArgumentError,
         r"errors must be 'raise' or 'record', got 'ignore'"),
        (lambda s: s.compute.apply(), errors.InvalidArgumentError, r"apply\(\) needs at least one"),
        (lambda s: s.results.export_metrics(export_format="xlsx"), errors.UnknownFormatError,
         r"Unknown export_format 'xlsx'\. Choose one of"),
        (lambda s: s.results.export_metrics(export_format="jsn"), errors.UnknownFormatError,
         r"Did you mean 'json'\?"),
        (lambda s: s.results.erase(), errors.InvalidArgumentError, r"erase\(\) needs at least one"),
        (lambda s: s.results.erase("weights"), errors.InvalidArgumentError, r"holds the model's weights"),
        (lambda s: s.filter(["nope"]), errors.UnknownModelError, r"Unknown model id\(s\) \['nope'\]"),
        (lambda s: s.models.add({"w": np.ones(2)}, model_id=""), errors.ModelError, r"model_id must be"),
        (lambda s: s.models.add(42, model_id="x"), errors.ModelSourceError, r"cannot read a builtins\.int"),
        (lambda s: s.compute.configure_kernel("frob_nrm"), errors.UnknownKernelError, r"Did you mean 'frob_norm'"),
        (lambda s: s.compute.kernel(produce="x"), errors.KernelDefinitionError, r"unknown option\(s\) \['produce'\]"),
        (lambda s: Session(profile="rma"), errors.UnknownProfileError, r"Did you mean 'ram'\?"),
        (lambda s: Session(config=3), errors.ConfigError, r"config must be a path, a mapping or None"),
    ],
    ids=["errors-arg", "no-fields", "format", "format-typo", "erase-none", "erase-weights",
         "filter", "model-id", "model-type", "kernel", "kernel-option", "profile", "config"],
)
def test_bad_arguments_raise_value_errors_that_say_what_to_do(session, call, error, message):
    """Each bad argument raises its documented error, which is also a ValueError."""
    session.models.add({"w": np.ones((2, 2))}, model_id="m")
    with pytest.raises(error, match=message) as info:
        call(session)
    assert isinstance(info.value, errors.DiffractError) and isinstance(info.value, ValueError)
