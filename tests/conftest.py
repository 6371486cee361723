"""Shared fixtures: a fresh kernel registry per test, small models."""

from __future__ import annotations

import numpy as np
import pytest

from diffract.core.compute.registry import reset_registry


@pytest.fixture(autouse=True)
def fresh_registry():
    """Each test starts from the registry the installed plugins give (process-global)."""
    reset_registry()
    yield
    reset_registry()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def arrays(rng):
    """A small state dict of numpy arrays: two matrices, a conv kernel, a bias."""
    return {
        "layer0.weight": rng.standard_normal((16, 8)),
        "layer1.weight": rng.standard_normal((8, 12)),
        "conv.weight": rng.standard_normal((6, 3, 2)),
        "layer1.bias": rng.standard_normal(12),
    }


@pytest.fixture
def session():
    from diffract import Session

    with Session(profile="ram", config={"parallel": {"executor": "sequential"}}) as s:
        yield s
