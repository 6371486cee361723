"""Hook implementations: the ``analyze``, ``compare``, ``track``, ``catalog`` and ``demo``
commands.

This module is what the entry point loads: each command's modules (and rich, matplotlib,
torch) are imported only when that command runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from diffract.plugins import Command, hookimpl


def _configure_analyze(parser: argparse.ArgumentParser) -> None:
    from diffract_report.analyze import configure_analyze

    configure_analyze(parser)


def _run_analyze(args: argparse.Namespace) -> int:
    from diffract_report.analyze import main_analyze

    return main_analyze(args)


def _configure_compare(parser: argparse.ArgumentParser) -> None:
    from diffract_report.compare import configure_compare

    configure_compare(parser)


def _run_compare(args: argparse.Namespace) -> int:
    from diffract_report.compare import main_compare

    return main_compare(args)


def _configure_track(parser: argparse.ArgumentParser) -> None:
    from diffract_report.track import configure_track

    configure_track(parser)


def _run_track(args: argparse.Namespace) -> int:
    from diffract_report.analyze import command_entry
    from diffract_report.track import track

    return command_entry("track", track)(args)


def _configure_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="diffract-demo",
                        help="folder for the run's checkpoints, its store, plots and the report "
                             "(new, empty, or an earlier demo's; default: %(default)s)")


def _run_demo(args: argparse.Namespace) -> int:
    from diffract_report.analyze import command_entry
    from diffract_report.demo import run_demo

    return command_entry("demo", lambda a, say: run_demo(a.out)["exit"])(args)


def _configure_catalog(parser: argparse.ArgumentParser) -> None:
    from diffract_report.catalog import configure_catalog

    configure_catalog(parser)


def _run_catalog(args: argparse.Namespace) -> int:
    from diffract_report.catalog import run_catalog

    return run_catalog(args)


@hookimpl
def diffract_commands() -> Iterator[Command]:
    yield Command("analyze", "per-layer metrics and a model summary of checkpoints",
                  _configure_analyze, _run_analyze,
                  "Per-layer spectral metrics of each checkpoint, a model summary, and "
                  "optionally files, plots and a report.")
    yield Command("compare", "how layers move between checkpoints (alignment pack)",
                  _configure_compare, _run_compare,
                  "Pairwise metrics per layer between checkpoints: a table per metric, heat "
                  "maps with --plot, the report.")
    yield Command("track", "add a training run's new checkpoints to a store, incrementally",
                  _configure_track, _run_track,
                  "Tracks the checkpoints of a training run in a durable store: adds the new "
                  "ones, computes their metrics and their alignment with the previous and "
                  "first checkpoints, and prints which layers moved most and any sudden "
                  "change; --watch keeps polling.")
    yield Command("catalog", "write the metric catalog (Markdown) of the registered kernels",
                  _configure_catalog, _run_catalog)
    yield Command("demo", "train a small model with a planted event, track its checkpoints "
                          "into a store, find the event, write the report (CPU, ~10 s)",
                  _configure_demo, _run_demo)
