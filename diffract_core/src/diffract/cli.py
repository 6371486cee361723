"""The ``diffract`` command: ``analyze``, ``compare``, ``demo``, ``plugins``, ``kernels
[-v]`` and ``catalog``. Exit codes: 0 done, 1 some parameters failed, 2 usage errors."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _plugins(args: argparse.Namespace) -> int:
    from diffract.plugins import get_catalog

    catalog = get_catalog()
    for record in catalog.plugins:
        ep = f" (entry point {record.entry_point})" if record.entry_point else ""
        print(f"{record.label}{ep}: {record.status}")
        if record.reason:
            print(f"    reason: {record.reason}")
        for kind, names in sorted(record.provides.items()):
            print(f"    {kind}: {', '.join(names)}")
        if record.refused:
            print(f"    withheld (conflicts): {', '.join(record.refused)}")
    contested = sorted(
        {(claimed, providers) for names in catalog.contested.values()
         for claimed, providers in names.values()}
    )
    if contested:
        print("\nConflicts (neither provider is used until one is preferred):")
        for claimed, providers in contested:
            dist = providers[0].split(" ")[0]
            print(f"  {claimed!r}: {' and '.join(providers)}")
            print(f"    pick one: [plugins] prefer = {{ {claimed} = \"{dist}\" }}  "
                  f"(or DIFFRACT_PREFER={claimed}={dist})")
    return 0


def _kernels(args: argparse.Namespace) -> int:
    from diffract.plugins import get_registry

    registry = get_registry()
    for spec in registry.kernels():
        if not args.verbose:
            print(spec.name)
            continue
        print(f"{spec.name}  [{spec.apply_level.name}, {spec.execution_protocol.name}]  "
              f"from {spec.provider}")
        print(f"    requires: {', '.join(spec.require_fields) or '-'}")
        print(f"    produces: {', '.join(spec.produce_fields)}")
        config = registry.effective_config(spec.name)
        domains = spec.config_domains
        for i, (key, value) in enumerate(config.items()):
            label = "    config:   " if i == 0 else "              "
            print(f"{label}{key}={value!r}  ({domains[key].describe()})")
        if spec.summary:
            import shutil
            import textwrap

            width = max(40, min(100, shutil.get_terminal_size().columns))
            print(textwrap.fill(spec.summary, width, initial_indent="    ",
                                subsequent_indent="    "))
    return 0


def _catalog(args: argparse.Namespace) -> int:
    from diffract.catalog import render_catalog
    from diffract.errors import InvalidArgumentError
    from diffract.plugins import make_plugin_manager
    from diffract.plugins._manager import BUILTIN, _norm

    allow = [p for p in args.plugins.split(",") if p] if args.plugins is not None else None
    manager = make_plugin_manager(allow=allow)
    if allow is not None:
        known = {BUILTIN}
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


def _demo(args: argparse.Namespace) -> int:
    from diffract.demo import run_demo

    run_demo(args.out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="diffract", description="Metrics on every parameter of neural-network checkpoints."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    from diffract import _cli_analyze

    a = sub.add_parser("analyze", help="per-layer metrics and a model summary of checkpoints",
                       description="Per-layer spectral metrics of each checkpoint, a model "
                                   "summary, and optionally files, plots and a report.")
    _cli_analyze.configure_analyze(a)
    a.set_defaults(run=_cli_analyze.main_analyze)
    cmp = sub.add_parser("compare", help="how layers move between checkpoints (alignment pack)",
                         description="Pairwise metrics per layer between checkpoints: a "
                                     "table per metric, heat maps with --plot, the report.")
    _cli_analyze.configure_compare(cmp)
    cmp.set_defaults(run=_cli_analyze.main_compare)
    p = sub.add_parser("plugins", help="installed plugins, what they register, what failed")
    p.set_defaults(run=_plugins)
    k = sub.add_parser("kernels", help="registered kernels")
    k.add_argument("-v", "--verbose", action="store_true", help="fields, level, configuration")
    k.set_defaults(run=_kernels)
    c = sub.add_parser(
        "catalog", help="write the metric catalog (Markdown) of the registered kernels"
    )
    c.add_argument("-o", "--output", help="file to write (default: standard output)")
    c.add_argument("--plugins", help="comma-separated plugins to include (default: all installed)")
    c.set_defaults(run=_catalog)
    d = sub.add_parser("demo", help="train a small model, analyse and compare its "
                                    "checkpoints, write plots and a report (CPU, < 1 min)")
    d.add_argument("--out", default="diffract-demo",
                   help="folder for checkpoints, plots and the report (default: %(default)s)")
    d.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    import warnings

    from diffract.errors import DiffractError, DiffractWarning

    try:
        with warnings.catch_warnings():
            # each distinct warning of ours once; other libraries' as Python decides
            warnings.simplefilter("default", DiffractWarning)
            return int(args.run(args))
    except DiffractError as exc:
        print(f"diffract {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `diffract kernels -v | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
