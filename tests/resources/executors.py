"""What the executor tests share: a model of a few small matrices and a 7x7 ``victim``
(the parameter ``die_on_shape`` kills its worker on), and one PARALLEL kernel applied
on it under an executor, the pool forced."""

from __future__ import annotations

from typing import Any

import numpy as np

from diffract import KernelExecutionProtocol, Session


def model(rng: np.random.Generator, n: int = 10) -> dict[str, np.ndarray]:
    out = {f"p{i}": rng.standard_normal((8 + i, 6)) for i in range(n)}
    out["victim"] = np.ones((7, 7))
    return out


def run(session_kwargs: dict[str, Any], weights: dict[str, np.ndarray], kernel: Any,
        name: str, **config: Any) -> tuple[Any, dict[str, Any]]:
    """(the apply report, parameter -> value) of ``kernel`` registered as ``name``."""
    with Session(config={"parallel": {"pool_min_seconds": 0}}, **session_kwargs) as s:
        s.compute.kernel(name=name, execution_protocol=KernelExecutionProtocol.PARALLEL)(kernel)
        if config:
            s.compute.configure_kernel(name, **config)
        s.models.add(weights, model_id="m")
        report = s.compute.apply(name, errors="record")
        rows = s.results.export_metrics(name)["m"]
    return report, {p: r[name] for p, r in rows.items()}
