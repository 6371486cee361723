"""The metric catalog: a Markdown page generated from the kernel registry.

``diffract catalog -o docs/metrics.md`` writes it; a test regenerates it and fails when
the committed page differs, so the catalog never drifts from the registered kernels.
Each entry: the fields a kernel produces and their aliases, its level and execution
protocol, its input fields, its configuration with defaults and accepted values, its
provider, and its docstring (the formula)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from diffract.core.compute.spec import KernelSpec

__all__ = ["render_catalog"]


def _provider(spec: KernelSpec) -> str:
    # Versions change with every release; the catalog names the distribution only.
    return re.sub(r" \S+$", "", spec.provider)


def render_catalog(kernels: Iterable[KernelSpec]) -> str:
    """Markdown for ``kernels``: an index of fields, then one section per kernel."""
    specs = sorted(kernels, key=lambda s: s.name)
    lines = [
        "# Metric catalog",
        "",
        "Generated from the kernel registry by `diffract catalog` (see README); do not edit.",
        "",
        "| field | kernel | level | inputs |",
        "| --- | --- | --- | --- |",
    ]
    rows = sorted(
        [(field, "", spec) for spec in specs for field in spec.produce_fields]
        + [(alias, field, spec) for spec in specs for alias, field in spec.aliases]
    )
    for field, target, spec in rows:
        kernel = f"[{spec.name}](#{spec.name})"
        if target:  # an alias: same kernel, another name
            kernel += f" (alias of `{target}`)"
        lines.append(
            f"| `{field}` | {kernel} | {spec.apply_level.name} | "
            f"{', '.join(f'`{f}`' for f in spec.require_fields)} |"
        )
    for spec in specs:
        lines += ["", f"## {spec.name}", ""]
        lines.append(f"- produces: {', '.join(f'`{f}`' for f in spec.produce_fields)}")
        if spec.aliases:
            lines.append("- aliases: " + ", ".join(f"`{a}` for `{f}`" for a, f in spec.aliases))
        lines.append(f"- level: {spec.apply_level.name}; execution: {spec.execution_protocol.name}")
        lines.append(f"- inputs: {', '.join(f'`{f}`' for f in spec.require_fields)}")
        domains = spec.config_domains
        config = "; ".join(
            f"`{k}={v!r}` ({domains[k].describe()})" if k in domains else f"`{k}={v!r}`"
            for k, v in spec.config
        )
        lines.append(f"- configuration: {config or 'none'}")
        if spec.restrictions:
            lines.append(f"- applies to: {'; '.join(r.reason for r in spec.restrictions)}")
        lines.append(f"- provided by: {_provider(spec)}")
        if spec.doc:
            lines += ["", *spec.doc.strip().splitlines()]
    return "\n".join(lines) + "\n"
