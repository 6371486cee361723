"""The metric catalog: a Markdown page generated from the kernel registry, and the
``diffract catalog`` command that writes it (in diffractml-core's ``diffract.catalog``
before version 0.2).

``diffract catalog -o docs/metrics.md`` writes it; a test regenerates it and fails when
the committed page differs, so the catalog never drifts from the registered kernels.
Each entry: the fields a kernel produces and their aliases, its level and execution
protocol, its input fields, its configuration with defaults and accepted values, its
provider, and its docstring (the formula)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable

from diffract.errors import InvalidArgumentError
from diffract.plugins import KernelSpec, make_plugin_manager

__all__ = ["configure_catalog", "render_catalog", "run_catalog"]


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


def configure_catalog(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", help="file to write (default: standard output)")
    parser.add_argument("--plugins",
                        help="comma-separated plugins to include (default: all installed)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run_catalog(args: argparse.Namespace) -> int:
    """``diffract catalog``: the page for the kernels of the plugins ``--plugins`` names
    (a plugin manager of its own, so other installed packs stay out), or of all."""
    allow = [p for p in args.plugins.split(",") if p] if args.plugins is not None else None
    manager = make_plugin_manager(allow=allow)
    if allow is not None:
        known = {"diffractml-core"}
        for record in manager.catalog().plugins:
            known.add(_norm(record.distribution))
            if record.entry_point:
                known.add(_norm(record.entry_point))
        unknown = [p for p in allow if _norm(p) not in known]
        if unknown:
            raise InvalidArgumentError(
                f"--plugins names no installed plugin: {', '.join(unknown)}. Installed: "
                f"{', '.join(sorted(known))} (see `diffract plugins`)."
            )
    text = render_catalog(manager.catalog().kernels)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0
