"""``diffract track``: the checkpoints of a training run, incrementally, into a store.

Every checkpoint the paths name (files or Hugging Face-style directories, a folder of
them, or a glob) that the store lacks is added, in step order; one already there and
unchanged is skipped, one changed on disk is refused with what changed. The chosen
metrics are computed where they are absent (so only for new checkpoints), and the
alignment of each checkpoint with its predecessor and with the first (``--against``),
from each checkpoint's SVD, computed once. The command prints, per metric, the layers
that moved most over the last interval and over the whole run, and sudden changes (a
change beyond ``--mad`` median absolute deviations of that layer's own history);
``--watch SECONDS`` keeps polling for new checkpoints until interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from diffract.errors import printable
from diffract_report._inputs import (
    DEFAULT_METRICS,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    VIEW_METRICS,
    UsageError,
    add_session_arguments,
    apply_settings,
    check_metrics,
    checkpoints_inside,
    is_checkpoint,
    model_inputs,
    object_checkpoints,
    open_session,
    parents_only,
    shell_words,
    storage_options,
    url_options,
    view_arguments,
)
from diffract_report._output import ProgressBar, outcomes_reported_by_us, tell_failures
from diffract_report._vectors import (
    SVD_GROUP,
    prune,
    svd_setting_restored,
    svd_settings,
    views_of,
)
from diffract_report.sudden import sudden

__all__ = ["categorical", "changes", "checkpoints", "configure_track", "sudden",
           "sudden_lines", "track"]

#: Pairwise fields of the alignment with the predecessor and the first checkpoint.
ALIGNMENT = ("l_subspace_overlap", "avg_max_l_agreement_top", "sval_rel_change")
#: Alignment fields over every direction: computed where the run keeps every direction's
#: vectors (--set svd.vector_share=1); with the top tenth they would be another number.
ALIGNMENT_ALL = ("avg_max_l_agreement",)
#: Layers shown per metric for each of "last interval" and "whole run".
TOP = 5


def configure_track(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="DIR_OR_GLOB",
                   help="checkpoints: files or checkpoint directories, a folder holding "
                        "them, or a glob ('runs/a/checkpoint-*'); none: report the run "
                        "the store holds already (a diffractml-training monitor's store)")
    p.add_argument("--metrics", metavar="a,b,...",
                   help=f"per-layer fields (default: {','.join(DEFAULT_METRICS)})")
    p.add_argument("--against", default="previous,first", metavar="previous,first",
                   help="alignment of each checkpoint with its predecessor and/or the first "
                        "(needs diffractml-kernels-alignment; 'none' skips it)")
    p.add_argument("--mad", type=float, default=10.0, metavar="K",
                   help="flag a change beyond K median absolute deviations of that layer's "
                        "own history (default: %(default)s)")
    p.add_argument("--watch", type=float, metavar="SECONDS",
                   help="poll for new checkpoints every SECONDS until interrupted")
    p.add_argument("--keep-vectors", action="store_true",
                   help="keep every checkpoint's singular vectors and the pairwise overlap "
                        "matrices in the store (by default only the first and the latest "
                        "checkpoint's left vectors stay: what the next checkpoint's "
                        "alignment reads). A run keeps the vectors of each matrix's top "
                        "tenth of directions, in float32: the alignment fields are computed "
                        "on those (--set svd.vector_share=1 keeps all, svd.vectors=float64 "
                        "in float64; a store goes on with the settings it was started with)")
    add_session_arguments(p)
    p.set_defaults(profile="local")


def checkpoints(patterns: Sequence[str], storage: dict[str, Any] | None = None) -> list[str]:
    """The checkpoint paths: each pattern a glob, a checkpoint, or a folder of them (a URL
    pattern: the same, in object storage; ``storage``: --storage-option's)."""
    from diffract.plugins import url_scheme

    out: list[str] = []
    for pattern in patterns:
        if url_scheme(pattern):
            out += object_checkpoints(pattern, storage or {})
            continue
        matches = sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else (
            [pattern] if os.path.exists(pattern) else [])  # a name too long: False
        if not matches:
            raise UsageError(f"{printable(pattern)}: matches no checkpoint (no such file, "
                             "directory or glob match).")
        for match in map(Path, matches):
            if is_checkpoint(match):
                out.append(str(match))
            elif match.is_dir():
                inside = [str(p) for p in checkpoints_inside(match)]
                if not inside:
                    raise UsageError(f"{printable(str(match))}: a folder holding no "
                                     "checkpoint a model format reads.")
                out += inside
    return list(dict.fromkeys(out))


def changes(frame: Any) -> tuple[Any, Any]:
    """(last interval's change, the whole run's change) per column of a trajectory."""
    if len(frame) < 2:
        return frame.iloc[:0].sum(), frame.iloc[:0].sum()
    return frame.iloc[-1] - frame.iloc[-2], frame.iloc[-1] - frame.iloc[0]


@contextlib.contextmanager
def _one_round_at_a_time(store: str, say: Callable[[str], None]) -> Any:
    """Rounds of the tracks sharing a store take turns (an exclusive lock on
    ``<store>/.track.lock``): a round erases vectors that another's pairs may be reading
    (two tracks at once failed a unit that way). Where there is no ``fcntl``, no lock."""
    try:
        import fcntl

        fh = open(Path(store) / ".track.lock", "a")  # noqa: SIM115 - closed below
    except (ImportError, OSError):  # Windows; a read-only store (its writes say so)
        yield
        return
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("waiting for another diffract track on this store to finish its round")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def categorical(session: Any, field: str) -> bool:
    """Whether ``field`` holds words (``pl_fit_quality``: "ok", "poor"), which a
    trajectory reads as NaN and which move by no amount."""
    return any(isinstance(row.get(field), str) for rows in
               session.results.export_metrics(field).values() for row in rows.values())


def _pairs(ids: Sequence[str], against: set[str]) -> list[tuple[str, str]]:
    pairs = []
    for i, model_id in enumerate(ids[1:], start=1):
        if "previous" in against:
            pairs.append((ids[i - 1], model_id))
        if "first" in against and i > 1:
            pairs.append((ids[0], model_id))
    return pairs


def _add_new(session: Any, paths: Sequence[str], args: argparse.Namespace,
             say: Callable[[str], None]) -> tuple[list[str], list[str]]:
    """Add the checkpoints the store lacks (step order); refuse changed ones, two with
    one step; returns the ids added and those that could not be read (each said on
    stderr with the reason: the others are tracked)."""
    from diffract.errors import DuplicateModelError, ModelSourceError
    from diffract.plugins import url_scheme

    held = {r["model_id"]: r for r in session.models.list()}
    new, unreadable = [], []
    # a tracked checkpoint that is gone (a Trainer's save_total_limit) keeps its results;
    # only one that is there and differs is refused
    for model_id, what, _file in model_inputs(paths):
        if model_id in held:
            changed = session.store.source(model_id).changed_files()
            if changed:
                where = "in object storage" if url_scheme(what) else "on disk"
                raise UsageError(f"checkpoint {model_id!r} changed {where} since it was "
                                 f"tracked: {'; '.join(changed)}. Track it under another "
                                 "name, or start another --store.")
            continue
        try:
            session.models.add(what, model_id=model_id, key=args.key,
                               step_from=args.step_from, **view_arguments(args),
                               **url_options(what, storage_options(args)))
        except ModelSourceError as exc:
            print(f"diffract track: checkpoint {model_id!r} left out: {shell_words(str(exc))}",
                  file=sys.stderr)
            unreadable.append(model_id)
            continue
        except DuplicateModelError:  # another track on this store added it meanwhile
            continue
        new.append(model_id)
    steps = session.models.steps()
    seen: dict[Any, str] = {}
    for model_id in session.models.ordered():
        step = steps[model_id].get("step")
        if step is None:
            session.models.erase(*new)
            raise UsageError(f"checkpoint {model_id!r} has no step in its name or a "
                             "trainer_state.json; give --step-from REGEX.")
        if step in seen:
            session.models.erase(*new)
            raise UsageError(f"checkpoints {seen[step]!r} and {model_id!r} both have step "
                             f"{step}; tell them apart with --step-from REGEX.")
        seen[step] = model_id
    if new:
        say(f"added {len(new)} checkpoint(s): {', '.join(session.models.ordered(new))}")
    return new, unreadable


def _mads(size: float) -> str:
    return f"{size:.0f}" if size < 1000 else ">1000"


def _movers(session: Any, metrics: Sequence[str], k: float, say: Callable[[str], None]) -> None:
    """Per metric the layers that moved most over the last interval and the whole run;
    then the sudden changes of every metric, largest first."""
    flagged = []
    for field in metrics:
        if field in ("warning",):
            continue
        frame = session.results.trajectory(field)
        if frame.empty or len(frame) < 2 or categorical(session, field):
            continue  # a categorical field (pl_fit_quality) does not move by an amount
        last, whole = changes(frame)
        steps = list(frame.index)
        parts = []
        for label, delta in ((f"{steps[-2]} -> {steps[-1]}", last),
                             (f"{steps[0]} -> {steps[-1]}", whole)):
            moved = delta.dropna()
            top = moved[moved != 0].abs().sort_values(ascending=False).index[:TOP]
            listed = ", ".join(f"{name} {delta[name]:+.3g}" for name in top)
            parts.append(f"{label}: " + (listed or ("no change" if len(moved) else
                                                    "undefined")))
        say(f"{field} moved most  " + "  |  ".join(parts))
        flagged += [(size, field, step, column, change)
                    for step, column, change, size in sudden(frame, k)]
    for line in sudden_lines(flagged, k):
        say(line)


def _head_movers(session: Any, args: argparse.Namespace, say: Callable[[str], None]) -> None:
    """With views: the heads that moved most between consecutive checkpoints (1 - the
    overlap of their top singular subspaces with the previous checkpoint's), and all of
    them in ``head_moves.csv`` under ``--out``."""
    import csv

    from diffract_report.views import head_moves

    moves = head_moves(session)
    if not moves:
        return
    say("heads that moved most (1 - the smaller of the output and input subspace overlaps "
        "with the previous checkpoint):")
    for r in moves[:TOP]:
        say(f"  step {r['from_step']} -> {r['step']}  {r['head']}  {r['change']:.3g}")
    if args.out:
        path = Path(args.out) / "head_moves.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, ["step", "from_step", "checkpoint", "head", "change"])
            writer.writeheader()
            writer.writerows(moves)
        say(f"wrote {path}")


def _write_trajectories(session: Any, metrics: Sequence[str],
                        args: argparse.Namespace) -> list[Path]:
    """Under ``--out``: per numeric metric its trajectory (one row per checkpoint, by
    step; a column per parameter), ``trajectory-<metric>.<csv|json|parquet>``, and with
    views ``trajectory-<metric>-views``; the alignment with the previous and the first
    checkpoint as ``alignment.csv`` (every pair, layer and field)."""
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    ext = "csv" if args.format == "table" else args.format
    written = []
    for field in dict.fromkeys(metrics):
        if field == "warning" or categorical(session, field):
            continue
        for by, suffix in (("param", ""), ("view", "-views")):
            frame = session.results.trajectory(field, by=by)
            if frame.empty:
                continue
            path = folder / f"trajectory-{field}{suffix}.{ext}"
            if ext == "csv":
                frame.to_csv(path)
            elif ext == "json":
                frame.to_json(path, orient="index", indent=1)
            else:
                try:
                    frame.to_parquet(path)
                except ImportError:
                    raise UsageError("--format parquet needs pyarrow: pip install pyarrow "
                                     "(or use --format csv).") from None
            written.append(path)
    fields = _alignment_fields(session, every=True)
    stored = {name.split("@", 1)[0] for name in session.store.aggregate_names()}
    if set(fields) & stored:
        written.append(session.results.export_aggregates(*fields, export_format="csv",
                                                         path=folder / "alignment.csv"))
    return written


def _alignment_fields(session: Any, every: bool = False) -> list[str]:
    """The alignment fields a round computes (installed ones): the top-tenth ones, and
    those over every direction where the svd keeps every direction's vectors (all of
    them with ``every``, for reading what a store holds)."""
    known = set(session.compute.list_available_metrics())
    share = (session.compute.kernel_config("svd").get("vector_share", 1.0)
             if "svd" in session.compute.list_available_kernels() else 1.0)
    wanted = [*ALIGNMENT, *(ALIGNMENT_ALL if every or share >= 1.0 else ())]
    return [f for f in wanted if f in known]


def sudden_lines(flagged: Sequence[tuple[float, str, Any, str, float]], k: float) -> list[str]:
    """The sudden changes ((size, field, step, layer, change) each) grouped by step and
    layer: the (step, layer) flagged by the most metrics first, then by size."""
    if not flagged:
        return []
    groups: dict[tuple[Any, str], list[tuple[float, str, float]]] = {}
    for size, field, step, column, change in flagged:
        groups.setdefault((step, column), []).append((size, field, change))
    ranked = sorted(groups.items(), key=lambda g: (-len(g[1]), -max(r[0] for r in g[1])))
    lines = [f"sudden changes (beyond {k:g} median absolute deviations of the layer's own "
             f"history): {len(flagged)} in {len(groups)} (step, layer)"]
    for (step, column), rows in ranked[:2 * TOP]:
        rows.sort(key=lambda r: -r[0])
        lines.append(f"  step {step}  {column}: " + ", ".join(
            f"{field} {change:+.3g} ({_mads(size)} MADs)" for size, field, change in rows))
    return lines


def _alike(session: Any, ids: Sequence[str], say: Callable[[str], None]) -> list[str]:
    """The checkpoints whose parameters (names and shapes) are the first's; each other
    one is said once, with what differs: it is analysed alone, outside the pairs."""
    def shapes(model_id: str) -> dict[str, tuple[int, ...]]:
        return {p.name: tuple(p.shape) for p in session.models.params(model_id)
                if p.parent is None}

    if not ids:
        return []
    run = shapes(ids[0])
    alike = [ids[0]]
    for model_id in ids[1:]:
        own = shapes(model_id)
        if own == run:
            alike.append(model_id)
            continue
        missing, extra = sorted(run.keys() - own.keys()), sorted(own.keys() - run.keys())
        reshaped = sorted(n for n in run.keys() & own.keys() if run[n] != own[n])
        what = [f"{len(x)} {label} ({', '.join(x[:3])}{', ...' if len(x) > 3 else ''})"
                for x, label in ((missing, "missing"), (extra, "extra"),
                                 (reshaped, "of another shape")) if x]
        say(f"{model_id}: its parameters differ from the run's ({ids[0]}): "
            f"{'; '.join(what)}; analysed alone, its alignment pairs skipped.")
    return alike


def _one_checkpoint_in_memory(session: Any, ids: Sequence[str]) -> None:
    """The chunks in flight read at most one checkpoint's weights together (the largest
    one's, counted as the chunker counts a read: at least float32 per element; shared by
    the three chunks the runner holds at once), unless ``[cache] max_bytes`` sets the
    bound: left to the machine's free memory, a run of small checkpoints was read whole
    (20 of 28 MiB peaked at 512 MiB)."""
    if session.config.cache_max_bytes or not ids:
        return
    largest = max(sum(max(4, p.itemsize) * p.numel for p in session.models.params(m)
                      if p.parent is None) for m in ids)
    session.cache.max_bytes = max(int(largest), 16 << 20)


def _round(session: Any, paths: Sequence[str], metrics: Sequence[str], args: argparse.Namespace,
           say: Callable[[str], None], view_fields: Sequence[str] = ()) -> tuple[list[Any],
                                                                              list[str]]:
    """Add what is new, compute what is absent (``view_fields`` first, on parameters and
    views together, then ``metrics`` on the parameters alone, when given); returns the
    apply reports and the checkpoints that could not be read."""
    try:
        found = checkpoints(paths, storage_options(args))
    except UsageError as exc:  # the run's folder moved away while watched: wait for it
        if args.watch is None or not session.model_ids:
            raise
        say(f"{exc} Watching for it again in {args.watch:g} s.")
        found = []
    added, unreadable = _add_new(session, found, args, say)
    ids = _alike(session, session.models.ordered(), say)
    _one_checkpoint_in_memory(session, ids)
    svd_settings(session, ids, args.settings)
    interactive = sys.stderr.isatty() and not args.quiet
    against = {a.strip() for a in args.against.split(",") if a.strip()} - {"none"}
    fields = _alignment_fields(session) if against else []
    known = set(session.compute.list_available_metrics())
    stale = session.results.stale(*metrics, *view_fields, *fields)
    if stale:
        kernels = sorted({r["kernel"] for r in stale})
        say(f"{len(stale)} stored result(s) of {', '.join(kernels)} were computed with "
            "another configuration than this one: recomputing them (and what depends on "
            "them), as apply(..., recompute='stale') does.")
    # nothing stale at the start: presence is all there is to check (the staleness
    # walk reads every stamp of the store, per apply: a round's cost grew with the run)
    mode = "stale" if stale else "presence"
    keep = {*metrics, *view_fields}
    heads = views_of(session) if "r_subspace_overlap" in known else []
    pairs = _pairs(ids, against) if fields else []
    # A new checkpoint's singular vectors, which its pairs read, are computed with its
    # first fields (the views' when it has views whose heads are compared): the runner
    # reads each weight once for both (read_together; from object storage a second read
    # is a second fetch). One checkpoint at a time, its pairs and the pruning after it.
    svd = list(SVD_GROUP) if fields and set(SVD_GROUP) <= known else []
    new = set(added)
    fresh = [m for m in ids if m in new] if svd and (heads or not view_fields) else []
    reports: list[Any] = []
    pruned = ""  # the checkpoint the round's last pruning was after
    with ProgressBar(interactive) as bar, outcomes_reported_by_us():
        def apply(view: Any, *asked: str) -> None:
            reports.append(view.compute.apply(*asked, errors="record", progress=bar,
                                              recompute=mode))

        def align(later: str) -> None:
            """The pairs ending at ``later``; the vectors they read pruned after them: the
            store never holds more than the reference's, the previous and the current."""
            nonlocal pruned
            now = [p for p in pairs if p[1] == later]
            done = [*session.compute.apply_pairs(*fields, pairs=now, errors="record",
                                                 recompute=mode).values(),
                    *(session.filter(param_names=heads).compute.apply_pairs(
                        "r_subspace_overlap", pairs=now, errors="record",
                        recompute=mode).values() if heads else ())]
            reports.extend(done)
            if not args.keep_vectors and any(sum(r.computed.values()) for r in done):
                prune(session, ids[:ids.index(later) + 1], keep, first="first" in against)
                pruned = later

        for model_id in fresh:
            apply(session.filter(model_ids=[model_id]), *(view_fields or metrics), *svd)
            align(model_id)
        if view_fields:
            apply(session, *view_fields)
        parents = parents_only(session, session, session.model_ids) if view_fields \
            else session
        apply(parents, *metrics)
        for later in dict.fromkeys(b for _, b in pairs):  # those of checkpoints tracked
            align(later)
        if pairs and not args.keep_vectors and pruned != pairs[-1][1]:  # a killed round's
            prune(session, ids, keep, first="first" in against)
    return reports, unreadable


def _stored(session: Any, metrics: Sequence[str], given: bool, store: str) -> list[str]:
    """With no checkpoint paths: the run the store holds, as it stands (nothing is
    computed: a monitor's store keeps no weights). The metrics it has, of those asked."""
    ids = session.models.ordered()
    if not ids:
        raise UsageError(f"the store {store} holds no run yet: give the "
                         "checkpoints to track.")
    held = set().union(*(session.store.fields(m) for m in ids))
    missing = [m for m in metrics if m not in held]
    if given and missing:
        raise UsageError(f"the store holds no {', '.join(missing)} (it has "
                         f"{', '.join(sorted(held)) or 'nothing'}); without checkpoint paths "
                         "track computes nothing: ask for stored fields or give the paths.")
    return [m for m in metrics if m in held]


def track(args: argparse.Namespace, say: Callable[[str], None] = print) -> int:
    started = time.perf_counter()
    if args.store is None:
        raise UsageError("track keeps the run in a durable store: give --store PATH.")
    if args.plot:
        raise UsageError("track draws its charts in --report FILE.html (heat maps of every "
                         "metric over the steps); --plot is analyze's, for one checkpoint.")
    if args.format != "table" and not args.out:
        raise UsageError(f"--format {args.format} writes the trajectories as files: give --out "
                         "DIR.")
    bad = {a.strip() for a in args.against.split(",")} - {"previous", "first", "none", ""}
    if bad:
        raise UsageError(f"--against takes previous, first or none, got {sorted(bad)}.")
    if not args.paths and args.watch is not None:
        raise UsageError("--watch polls for new checkpoints: give their paths (a monitor's "
                         "store is reported as it stands; run track again for its new steps).")
    metrics = [m.strip() for m in (args.metrics or ",".join(DEFAULT_METRICS)).split(",")
               if m.strip()]
    view_fields = list(VIEW_METRICS) if args.views and not args.metrics else []
    if args.paths:
        # a path matching nothing is refused before a store is made
        checkpoints(args.paths, storage_options(args))
    from diffract_report._allocator import return_freed_buffers

    return_freed_buffers()  # freed SVD buffers leave the process (docs/storage.md)
    session = open_session(args)
    with session, svd_setting_restored(session):
        check_metrics(session, [*metrics, *view_fields])
        apply_settings(session, args.settings, args.conventions)
        if not args.paths:
            metrics = _stored(session, metrics, bool(args.metrics), args.store)
            if args.views and session.model_ids and not views_of(session):
                say(f"--views {printable(args.views)}: the checkpoints in "
                    f"{printable(str(args.store))} were added without views, and a store's "
                    "models keep the views they were added with: track the checkpoints into "
                    "a new store with --views.")
        try:
            while True:
                reports, unreadable = [], False
                if args.paths:
                    with _one_round_at_a_time(args.store, say):
                        reports, unreadable = _round(session, args.paths, metrics, args, say,
                                                     view_fields)
                _movers(session, metrics, args.mad, say)
                _head_movers(session, args, say)
                if args.out:
                    for path in _write_trajectories(session, [*metrics, *view_fields], args):
                        say(f"wrote {path}")
                if args.report:
                    from diffract_report.trajectory_report import write_track_report

                    written = write_track_report(session, args.report, metrics, args.mad,
                                                 view_fields)
                    say(f"wrote {written}")
                if args.watch is None:
                    break
                time.sleep(args.watch)
        except KeyboardInterrupt:
            print("diffract track: interrupted; the store holds every committed result: run "
                  "the same command to go on.", file=sys.stderr)
            return EXIT_INTERRUPTED
        if tell_failures(reports, say) or unreadable:
            return EXIT_FAILED
    say(f"done in {time.perf_counter() - started:.1f} s")
    return EXIT_OK
