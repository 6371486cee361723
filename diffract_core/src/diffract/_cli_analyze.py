"""``diffract analyze``: checkpoints in, a per-layer table and a model summary out.

Only the public API is used (Session, compute, results, diffract.report); what a user
can do here they can do from Python. Terminal niceties (rich tables, progress bars) are
imported only when they are shown.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from diffract.errors import InvalidArgumentError
from diffract.report import format_table, format_value

#: The WeightWatcher-like default set.
DEFAULT_METRICS = ("pl_alpha", "alpha_weighted", "stable_rank", "log_norm", "spectral_norm",
                   "mp_softrank", "num_spikes")

#: Which distribution brings a field that is not installed (a hint, not a registry;
#: tests/core/test_cli_analyze.py checks it against the installed packs).
PACK_OF = {
    "diffract-kernels-spectral": (
        "ERG_gap", "alpha_weighted", "aspect_ratio", "best_fit", "detX_num", "detX_val",
        "effective_rank", "esd", "esd_max", "esd_min", "esd_rand", "esd_rand_max",
        "esd_rand_min", "esd_scale", "exp_concentration", "exp_ks_distance", "exp_lambda",
        "exp_presence", "exp_scale", "exp_xmin", "greater_dim", "hard_rank",
        "log_alpha_norm", "log_norm", "log_prod_frob_norm", "log_prod_spectral_norm",
        "log_spectral_norm", "lower_dim", "lr_exp_R", "lr_exp_p", "lr_lognormal_R",
        "lr_lognormal_p", "lr_tpl_R", "lr_tpl_p", "matrix_entropy", "matrix_rank",
        "max_weights_sval", "min_weights_sval", "model_log_norm", "model_log_spectral_norm",
        "model_pl_alpha_norm", "model_tpl_alpha_norm", "mp_bulk_max", "mp_bulk_std",
        "mp_concentration", "mp_esd_max", "mp_esd_min", "mp_ks", "mp_num_spikes",
        "mp_presence", "mp_soft_rank", "mp_softrank", "mp_sval_max", "nuclear_norm",
        "num_fingers", "num_pl_spikes", "num_spikes", "pl_alpha", "pl_alpha_norm",
        "pl_concentration", "pl_ks_distance", "pl_n_tail", "pl_presence", "pl_pvalue",
        "pl_sigma", "pl_xmax", "pl_xmin", "rand_distance", "rank_loss", "spectral_norm",
        "stable_rank", "svals", "tpl_alpha", "tpl_alpha_norm", "tpl_concentration",
        "tpl_ks_distance", "tpl_lambda", "tpl_presence", "tpl_scale", "tpl_xmin",
        "tw_esd_bound", "tw_num_spikes", "w1_rand_distance", "weak_rank_loss",
        "weights_lsvs", "weights_rand", "weights_rsvs", "weights_std", "weights_svals",
        "ww_maxdist", "ww_softrank",
    ),
    "diffract-kernels-alignment": (
        "l_overlap", "r_overlap", "l_agreement", "r_agreement", "max_l_agreement",
        "max_r_agreement", "avg_l_agreement", "avg_r_agreement", "avg_max_l_agreement",
        "avg_max_r_agreement", "l_subspace_overlap", "r_subspace_overlap",
        "l_principal_angles", "r_principal_angles", "sval_rel_change", "intruder_dimensions",
    ),
}

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(InvalidArgumentError):
    """A command-line mistake (exit code 2)."""


# -- arguments ---------------------------------------------------------------------------
def add_session_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conventions", metavar="NAME",
                   help="a kernel pack's configuration preset, applied before --set "
                        "(the spectral pack's: csn, the default; weightwatcher)")
    p.add_argument("--set", dest="settings", action="append", default=[],
                   metavar="KERNEL.KEY=VALUE",
                   help="kernel configuration, checked as configure_kernel checks it "
                        "(repeatable; VALUE is JSON or a bare word)")
    p.add_argument("--layers", metavar="REGEX",
                   help="only parameters whose name matches (searched anywhere)")
    p.add_argument("--exclude", metavar="REGEX", help="leave out parameters that match")
    p.add_argument("--profile", choices=None, default=None,
                   help="storage profile: ram (default) or local (with --store)")
    p.add_argument("--store", metavar="PATH",
                   help="a durable store (implies --profile local): an interrupted run "
                        "resumes where it stopped")
    p.add_argument("--executor", help="executor name (sequential, threads, processes, "
                                      "dask with its plugin)")
    p.add_argument("--out", metavar="DIR", help="directory for the table and summary files")
    p.add_argument("--format", default="table", choices=("table", "csv", "json", "parquet"),
                   help="table (terminal) or a file format (written to --out, else printed)")
    p.add_argument("--plot", metavar="DIR", help="write ESD and depth plots (PNG) here")
    p.add_argument("--report", metavar="FILE.html", help="write a self-contained HTML report")
    p.add_argument("--base", metavar="PATH",
                   help="analyse what fine-tuning changed: each PATH minus this checkpoint "
                        "(W - W_base, parameters of the same name and shape)")
    p.add_argument("--lora", action="store_true",
                   help="each PATH is a PEFT LoRA adapter (directory or adapter_model "
                        "file): analyse its updates scale * B @ A")
    p.add_argument("--include-1d", action="store_true",
                   help="show 1-D parameters (biases, norms) in the table")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def configure_analyze(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help=".safetensors file, Hugging Face-style directory, torch state-dict "
                        "file, or module:factory returning an nn.Module")
    p.add_argument("--metrics", metavar="a,b,...",
                   help=f"fields to compute (default: {','.join(DEFAULT_METRICS)})")
    add_session_arguments(p)


# -- inputs ------------------------------------------------------------------------------
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _load_factory(spec: str) -> Any:
    import importlib

    module_name, _, attr = spec.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"{spec}: cannot import module {module_name!r} ({exc}). Give a "
                         "module importable from here (or a file path).") from None
    finally:
        sys.path.pop(0)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{spec}: module {module_name!r} has no {attr!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{spec}: {attr!r} is not callable; name a function that returns "
                         "an nn.Module.")
    return obj()


def model_inputs(paths: Sequence[str]) -> list[tuple[str, Any, str | None]]:
    """(model_id, what to add, file path or None) per PATH; ids from file names."""
    out: list[tuple[str, Any, str | None]] = []
    taken: set[str] = set()
    for raw in paths:
        path = Path(raw)
        if path.exists():
            stem = path.name if path.is_dir() else path.stem
            what: Any = str(path.resolve())
            file: str | None = what
            if stem in ("model", "pytorch_model") and path.parent.name:
                stem = path.resolve().parent.name  # model.safetensors: use its folder
        elif _FACTORY.match(raw):
            stem = raw.rsplit(":", 1)[1].rsplit(".", 1)[-1]
            what, file = _load_factory(raw), None
        else:
            raise UsageError(f"{raw}: no such file or directory. Give a .safetensors file, a "
                             "checkpoint directory, a torch state-dict file, or "
                             "module:factory.")
        model_id = re.sub(r"[^\w.\-]+", "_", stem) or "model"
        base, n = model_id, 2
        while model_id in taken:
            model_id, n = f"{base}-{n}", n + 1
        taken.add(model_id)
        out.append((model_id, what, file))
    return out


def parse_setting(text: str) -> tuple[str, str, Any]:
    """``KERNEL.KEY=VALUE`` -> (kernel, key, value); VALUE is JSON, else a bare string."""
    head, sep, value = text.partition("=")
    kernel, dot, key = head.strip().rpartition(".")
    if not sep or not dot or not kernel or not key:
        raise UsageError(f"--set {text!r}: expected KERNEL.KEY=VALUE, e.g. "
                         "--set power_law_fit.min_tail=5.")
    value = value.strip()
    lowered = {"true": True, "false": False, "none": None, "null": None}
    if value.lower() in lowered:
        return kernel, key, lowered[value.lower()]
    try:
        return kernel, key, json.loads(value)
    except ValueError:
        return kernel, key, value


def _regex(text: str | None, flag: str) -> re.Pattern[str] | None:
    if text is None:
        return None
    try:
        return re.compile(text)
    except re.error as exc:
        raise UsageError(f"{flag} {text!r} is not a regular expression: {exc}.") from None


def check_metrics(session: Any, metrics: Sequence[str]) -> None:
    """Every metric produced by an installed kernel (or an alias of one), or an error
    naming the pack."""
    known = set(session.compute.list_available_metrics()) | set(session.registry.aliases())
    for field in metrics:
        if field in known:
            continue
        pack = next((d for d, fields in PACK_OF.items() if field in fields), None)
        if pack is not None:
            raise UsageError(f"Metric {field!r} comes from {pack}, which is not installed: "
                             f"pip install {pack}.")
        from diffract.errors import UnknownFieldError

        raise UnknownFieldError(field, sorted(known))


def open_session(args: argparse.Namespace) -> Any:
    from diffract import Session

    profile = args.profile or ("local" if args.store else "ram")
    options: dict[str, Any] = {}
    if args.store:
        if profile != "local":
            raise UsageError(f"--store needs --profile local (got --profile {profile}).")
        options["path"] = args.store
    config: dict[str, Any] = {}
    if not args.quiet and sys.stderr.isatty():
        config["apply"] = {"chunk_seconds": 0.5}  # the bar moves at least twice a second
    kwargs: dict[str, Any] = {"executor": args.executor} if args.executor else {}
    return Session(profile=profile, config=config or None, **kwargs, **options)


def add_models(session: Any, inputs: Sequence[tuple[str, Any, str | None]], *,
               base: str | None = None, lora: bool = False) -> list[str]:
    """Add each model (a delta against model ``base``, or LoRA updates), or reuse it when
    a durable store already holds it from the same file (a resumed run)."""
    held = {r["model_id"]: r for r in session.models.list()}
    derived = base is not None or lora
    for model_id, what, file in inputs:
        if model_id in held:
            if file is not None and held[model_id]["source"] == file:
                continue  # resuming: the store has it, and its files are checked on read
            if derived and model_id != base:
                continue  # resuming a delta or LoRA model (stored as computed)
            raise UsageError(
                f"The store already holds a model {model_id!r} from "
                f"{held[model_id]['source']}, not from {file or 'this factory'}. Use another "
                "--store, or rename the file."
            )
        if lora:
            session.models.add_lora(what, model_id)
        else:
            session.models.add(what, model_id=model_id, base_model_id=base)
    return [m for m, _, _ in inputs]


def add_inputs(session: Any, inputs: Sequence[tuple[str, Any, str | None]],
               args: argparse.Namespace) -> list[str]:
    """The command's models: as given, as deltas against ``--base`` (added first, under
    ``<name>.base``, and not analysed), or as LoRA updates (``--lora``)."""
    base = None
    if args.base is not None:
        if args.lora:
            raise UsageError("--base and --lora do not go together: a LoRA adapter is "
                             "already an update.")
        ((base, base_what, base_file),) = model_inputs([args.base])
        base = f"{base}.base"
        add_models(session, [(base, base_what, base_file)])
    return add_models(session, inputs, base=base, lora=args.lora)


def scope(session: Any, model_ids: Sequence[str], args: argparse.Namespace) -> Any:
    """The view the command works in: the models given, the parameters --layers and
    --exclude keep."""
    keep, drop = _regex(args.layers, "--layers"), _regex(args.exclude, "--exclude")
    view = session.filter(model_ids=list(model_ids))
    if keep is None and drop is None:
        return view
    names = sorted({
        p.name for m in model_ids for p in session.models.params(m)
        if (keep is None or keep.search(p.name)) and not (drop is not None and drop.search(p.name))
    })
    if not names:
        raise UsageError("--layers/--exclude leave no parameter. `diffract analyze PATH "
                         "--format csv` without them lists every name.")
    return view.filter(param_names=names)


# -- progress ----------------------------------------------------------------------------
class ProgressBar:
    """A rich progress bar per step that runs longer than a second, advancing per
    committed chunk (chunks of at most ~0.5 s here, so per parameter for costly
    kernels). Nothing at all when quiet or not on a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None
        self._tasks: dict[tuple[int, str], Any] = {}
        self._step_started: dict[tuple[int, str], float] = {}
        self._last = time.perf_counter()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, event: Any) -> None:
        if not self.enabled:
            return
        key = (event.step, event.kernel)
        now = time.perf_counter()
        started = self._step_started.setdefault(key, self._last)
        self._last = now
        if key not in self._tasks:
            if event.done >= event.total or now - started < 1.0:
                return
            bar = self._ensure()
            self._tasks[key] = bar.add_task(
                f"[{event.step}/{event.steps}] {event.kernel}", total=event.total,
                completed=event.done)
        self._bar.update(self._tasks[key], completed=event.done)

    def _ensure(self) -> Any:
        if self._bar is None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                ProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.text import Text

            class Rate(ProgressColumn):
                def render(self, task: Any) -> Text:
                    speed = task.finished_speed or task.speed
                    return Text(" " * 8 if speed is None else f"{speed:>6.1f}/s")

            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Rate(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                redirect_stdout=False, redirect_stderr=False,
            )
            self._bar.start()
        return self._bar


# -- output ------------------------------------------------------------------------------
def table_rows(session: Any, view: Any, model_id: str, metrics: Sequence[str],
               include_1d: bool) -> list[list[Any]]:
    """Rows of (parameter, shape, metric values) in the view, 1-D parameters only when
    asked."""
    values = view.results.export_metrics(*metrics)[model_id]
    shapes = {p.name: p.shape for p in session.models.params(model_id)}
    rows = []
    for name, row in values.items():
        shape = shapes.get(name, ())
        if len(shape) < 2 and not include_1d:
            continue
        rows.append([name, "x".join(map(str, shape)), *(row.get(m) for m in metrics)])
    return rows


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]],
                console: Any | None, keys: int = 2) -> None:
    """A table whose first ``keys`` columns name the row; on a terminal (``console``) the
    value columns come in groups that fit its width, each group with the key columns
    again, so nothing is squeezed into ellipses or dropped."""
    if console is None:
        print(title)
        print(format_table(list(header), rows))
        return
    from rich import box
    from rich.table import Table

    cells = [[format_value(v) for v in r] for r in rows]
    heads = [h.replace("_", "_\n", 1) if i >= keys and len(h) > 7 else h
             for i, h in enumerate(header)]

    def width(i: int) -> int:
        return max([len(x) for x in heads[i].splitlines()] + [len(r[i]) for r in cells]) + 3

    fixed = sum(width(i) for i in range(keys))
    groups: list[list[int]] = [[]]
    used = fixed
    for i in range(keys, len(header)):
        if groups[-1] and used + width(i) > console.width:
            groups.append([])
            used = fixed
        groups[-1].append(i)
        used += width(i)
    for n, group in enumerate(groups):
        table = Table(title=title if n == 0 else None, title_justify="left",
                      header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
        for i in range(keys):
            table.add_column(heads[i], no_wrap=True, overflow="fold")
        for i in group:
            table.add_column(heads[i], justify="right", no_wrap=True)
        for r in cells:
            table.add_row(*r[:keys], *(r[i] for i in group))
        console.print(table)


def _console() -> Any | None:
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console()


def write_outputs(view: Any, metrics: Sequence[str], fmt: str, out: str | None,
                  summaries: list[dict[str, Any]]) -> list[Path]:
    """The metrics table in ``fmt`` (csv/json/parquet) and summary.json under ``out``;
    without ``out``, csv/json go to standard output."""
    written: list[Path] = []
    if out is None:
        if fmt == "parquet":
            raise UsageError("--format parquet writes a file: give --out DIR.")
        sys.stdout.write(view.results.export_metrics(*metrics, export_format=fmt))
        return written
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        frame = view.results.export_metrics(*metrics, export_format="pandas")
        try:
            frame.to_parquet(folder / "metrics.parquet")
        except ImportError:
            raise UsageError("--format parquet needs pyarrow: pip install pyarrow "
                             "(or use --format csv).") from None
        written.append(folder / "metrics.parquet")
    else:
        ext = "csv" if fmt == "table" else fmt
        written.append(view.results.export_metrics(*metrics, export_format=ext,
                                                   path=folder / f"metrics.{ext}"))
    from diffract.results import _plain

    (folder / "summary.json").write_text(json.dumps(_plain(summaries), indent=1,
                                                    allow_nan=False))
    written.append(folder / "summary.json")
    return written


# -- the command -------------------------------------------------------------------------
def apply_settings(session: Any, settings: Sequence[str], conventions: str | None = None) -> None:
    """The --conventions preset, then the --set values (which win), all checked."""
    if conventions:
        session.compute.configure_conventions(conventions)
    grouped: dict[str, dict[str, Any]] = {}
    for text in settings:
        kernel, key, value = parse_setting(text)
        grouped.setdefault(kernel, {})[key] = value
    for kernel, values in grouped.items():
        session.compute.configure_kernel(kernel, **values)


@contextlib.contextmanager
def outcomes_reported_by_us() -> Iterator[None]:
    """Silence apply's warnings about failed units and undefined values: the command
    reports both itself, grouped."""
    import warnings

    from diffract.errors import FailedUnitsWarning, UndefinedValuesWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedValuesWarning)
        warnings.simplefilter("ignore", FailedUnitsWarning)
        yield


def run_apply(view: Any, metrics: Sequence[str], bar: ProgressBar) -> Any:
    with outcomes_reported_by_us():
        return view.compute.apply(*metrics, errors="record", progress=bar)


def analyze(args: argparse.Namespace, say: Callable[[str], None] = print) -> int:
    from diffract.report import summarize, summary_lines

    started = time.perf_counter()
    metrics = [m.strip() for m in (args.metrics or ",".join(DEFAULT_METRICS)).split(",")
               if m.strip()]
    if not metrics:
        raise UsageError("--metrics is empty; name at least one field.")
    inputs = model_inputs(args.paths)
    session = open_session(args)
    with session:
        check_metrics(session, metrics)
        apply_settings(session, args.settings, args.conventions)
        model_ids = add_inputs(session, inputs, args)
        view = scope(session, model_ids, args)
        interactive = sys.stderr.isatty() and not args.quiet
        wanted = list(metrics)
        if (args.plot or args.report) and "esd" in session.compute.list_available_metrics():
            wanted.append("esd")  # the ESD plots draw it
        try:
            with ProgressBar(interactive) as bar:
                report = run_apply(view, wanted, bar)
        except KeyboardInterrupt:
            where = (f"rerun the same command with --store {args.store} to resume"
                     if args.store else "use --store PATH to keep results across runs")
            print(f"diffract analyze: interrupted; {where}.", file=sys.stderr)
            return EXIT_INTERRUPTED
        summaries = summarize(view, model_ids)
        to_terminal = args.format == "table"
        if to_terminal:
            console = _console() if sys.stdout.isatty() else None
            header = ["parameter", "shape", *metrics]
            for model_id in model_ids:
                rows = table_rows(session, view, model_id, metrics, args.include_1d)
                print_table(f"{model_id}: {len(rows)} layers", header, rows, console)
            for record in summaries:
                if record["layers"]:  # alpha was asked for
                    say("")
                    for line in summary_lines(record):
                        say(line)
        written = []
        if args.out or not to_terminal:
            written = write_outputs(view, metrics, args.format, args.out, summaries)
        if args.plot:
            from diffract.viz import plot_model

            for model_id in model_ids:
                written += plot_model(view, model_id, args.plot)
        if args.report:
            from diffract.report import write_html

            written.append(write_html(view, args.report, metrics=metrics,
                                      seconds=time.perf_counter() - started,
                                      command=" ".join(["diffract", *sys.argv[1:]])))
        tell = say if to_terminal else (lambda s: print(s, file=sys.stderr))
        for path in written:
            tell(f"wrote {path}")
        if report.failures:
            tell_failures(report.reasons("failed"), tell)
            return EXIT_FAILED
        tell(f"done in {time.perf_counter() - started:.1f} s")
    return EXIT_OK


_DOWNSTREAM = re.compile(r"^input '[^']+' is missing because '[^']+' failed on ")


def tell_failures(failed: dict[tuple[str, str, str], list[str]],
                  tell: Callable[[str], None]) -> None:
    """Failures grouped by reason, root causes first; units that failed only because an
    input failed upstream are counted under their kernel, not repeated."""
    roots = {k: u for k, u in failed.items() if not _DOWNSTREAM.match(k[2])}
    downstream: dict[str, int] = {}
    for (_, kernel, reason), units in failed.items():
        if _DOWNSTREAM.match(reason):
            downstream[kernel] = downstream.get(kernel, 0) + len(units)
    total = sum(len(u) for u in roots.values())
    tell(f"\n{total} parameter(s) failed:")
    for (_, kernel, reason), units in sorted(roots.items(), key=lambda kv: -len(kv[1])):
        more = f" and {len(units) - 1} more" if len(units) > 1 else ""
        tell(f"  {kernel} on {units[0]}{more}: {reason}")
    if downstream:
        tell("  and, because of them: " + ", ".join(f"{k} on {n}" for k, n in downstream.items()))


def _main(command: str, run: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """The entry of one command: its usage errors are one line on stderr, exit 2 (other
    Diffract errors are handled the same way by diffract.cli.main)."""

    def entry(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except UsageError as exc:
            print(f"diffract {command}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE

    return entry


# -- compare -----------------------------------------------------------------------------
#: Pairwise fields shown by default: direction agreement, subspace overlap, spectrum change.
DEFAULT_COMPARE = ("avg_max_l_agreement", "l_subspace_overlap", "sval_rel_change")


def configure_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="two or more checkpoints, in order (files, directories, "
                        "module:factory)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--to-first", dest="pairs", action="store_const", const="first",
                      help="compare each checkpoint with the first (a base and its "
                           "fine-tunes)")
    mode.add_argument("--pairs", dest="pairs", action="store_const", const="all",
                      help="compare every pair")
    p.set_defaults(pairs="consecutive")
    p.add_argument("--metrics", metavar="a,b,...",
                   help=f"pairwise fields (default: {','.join(DEFAULT_COMPARE)})")
    add_session_arguments(p)


def compare(args: argparse.Namespace, say: Callable[[str], None] = print) -> int:
    from diffract.report import pair_matrix

    started = time.perf_counter()
    if len(args.paths) < 2:
        raise UsageError("compare needs at least two checkpoints.")
    metrics = [m.strip() for m in (args.metrics or ",".join(DEFAULT_COMPARE)).split(",")
               if m.strip()]
    inputs = model_inputs(args.paths)
    session = open_session(args)
    with session:
        check_metrics(session, metrics)
        levels = {r["field"]: r["apply_level"]
                  for r in session.compute.list_available_metrics(True)}
        single = [m for m in metrics if levels.get(m) != "CROSS_MODEL"]
        if single:
            raise UsageError(f"{', '.join(single)}: not pairwise (CROSS_MODEL) fields; "
                             "compare takes fields that compare two checkpoints (use "
                             "`diffract analyze` for the others).")
        apply_settings(session, args.settings, args.conventions)
        model_ids = add_inputs(session, inputs, args)
        view = scope(session, model_ids, args)
        interactive = sys.stderr.isatty() and not args.quiet
        try:
            with ProgressBar(interactive) as bar, outcomes_reported_by_us():
                # the per-checkpoint inputs (SVDs) once for all, with one bar
                needs = sorted({f for m in metrics for f in _inputs_of(session, m)})
                reports = [view.compute.apply(*needs, errors="record", progress=bar)] if needs \
                    else []
                reports += view.compute.apply_pairs(*metrics, pairs=args.pairs,
                                                    errors="record").values()
        except KeyboardInterrupt:
            print("diffract compare: interrupted; rerun with --store PATH to resume.",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
        console = _console() if sys.stdout.isatty() and args.format == "table" else None
        sections = []
        written: list[Path] = []
        for field in metrics:
            layers, pairs, matrix = pair_matrix(view, field)
            if args.format == "table":
                rows = [[layer, *matrix[i]] for i, layer in enumerate(layers)]
                print_table(f"{field} (layer x pair)", ["parameter", *pairs], rows, console,
                            keys=1)
            if args.plot or args.report:
                from diffract import viz

                fig = viz.heatmap_figure(matrix, layers, pairs, field)
                if args.plot:
                    written.append(viz.save_png(fig, Path(args.plot) / f"compare_{field}.png"))
                if args.report:
                    from diffract.report import figure_html, html_table

                    sections.append(f"<h2>{field}</h2>" + figure_html(fig) + html_table(
                        ["parameter", *pairs], [[layer, *matrix[i]]
                                                for i, layer in enumerate(layers)],
                        table_id=f"compare-{field}"))
        if args.out or args.format != "table":
            fmt = "csv" if args.format == "table" else args.format
            if args.out is None:
                sys.stdout.write(view.results.export_aggregates(*metrics, export_format=fmt))
            else:
                folder = Path(args.out)
                folder.mkdir(parents=True, exist_ok=True)
                if fmt == "parquet":
                    raise UsageError("compare writes csv or json; --format parquet is for "
                                     "analyze.")
                written.append(view.results.export_aggregates(
                    *metrics, export_format=fmt, path=folder / f"compare.{fmt}"))
        if args.report:
            from diffract.report import write_html

            written.append(write_html(view, args.report, metrics=[], sections=sections,
                                      seconds=time.perf_counter() - started,
                                      command=" ".join(["diffract", *sys.argv[1:]])))
        tell = say if args.format == "table" else (lambda s: print(s, file=sys.stderr))
        for path in written:
            tell(f"wrote {path}")
        failed: dict[tuple[str, str, str], list[str]] = {}
        for report in reports:
            for key, units in report.reasons("failed").items():
                failed.setdefault(key, []).extend(units)
        if failed:
            tell_failures(failed, tell)
            return EXIT_FAILED
        tell(f"done in {time.perf_counter() - started:.1f} s")
    return EXIT_OK


def _inputs_of(session: Any, field: str) -> list[str]:
    """The per-parameter fields a pairwise field is computed from (their producers run
    on each checkpoint once, before the pairs)."""
    producer = {f: k for k in session.compute.list_available_kernels(True)
                for f in k["produce_fields"]}
    out: list[str] = []
    todo = [field]
    while todo:
        for f in producer[todo.pop()]["require_fields"]:
            if f not in producer:
                continue  # weights, shape: the model's own
            (out if producer[f]["apply_level"] == "PARAMETER" else todo).append(f)
    return out


main_analyze = _main("analyze", analyze)
main_compare = _main("compare", compare)
