"""The command line's shared part: session arguments, checkpoints in, a session out.

``analyze`` and ``compare`` take the same session arguments (presets, ``--set``, layer
filters, storage, executor, outputs) and the same inputs (files, directories,
``module:factory``, ``--base`` deltas, ``--lora`` adapters). Only the public API is
used: what a user can do here they can do from Python.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diffract.errors import (
    DiffractWarning,
    InvalidArgumentError,
    ModelSourceError,
    install_hint,
    printable,
    provider_of,
)

#: The WeightWatcher-like default set.
DEFAULT_METRICS = ("pl_alpha", "pl_fit_quality", "alpha_weighted", "stable_rank", "log_norm",
                   "spectral_norm", "mp_softrank", "num_spikes", "warning")

#: What views (heads, experts) get by default: metrics defined on a spectrum of a few
#: dozen points that tell a trained head from a random one of its shape (measured in
#: docs/views.md with benchmarks/head_metrics.py). A power-law fit needs min_tail=50
#: points in its tail, which a 32- or 64-row head does not have.
VIEW_METRICS = ("pl_alpha_hill", "stable_rank", "spectral_norm", "matrix_entropy")

#: Which distribution brings a field that is not installed (a hint, not a registry;
#: tests/core/test_cli_analyze.py checks it against the installed packs).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(InvalidArgumentError):
    """A command-line mistake (exit code 2)."""


# -- arguments ---------------------------------------------------------------------------
def _presets() -> str:
    """The installed conventions presets, the one the defaults follow marked."""
    from diffract.plugins import get_catalog, get_registry

    registry = get_registry()
    names = []
    for name, preset in sorted(get_catalog().conventions.items()):
        default = all(k in registry and all(registry.get(k).config_defaults.get(key) == value
                                            for key, value in values.items())
                      for k, values in preset.settings.items())
        names.append(f"{name} (the default)" if default else name)
    return ", ".join(names) or "none"


def add_session_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conventions", metavar="NAME",
                   help="a kernel pack's configuration preset, applied before --set "
                        f"(installed: {_presets()}; docs/spectral.md describes them)")
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
    p.add_argument("--executor", help="executor name (sequential, threads, processes; "
                                      "dask and ray with their plugins)")
    p.add_argument("--out", metavar="DIR", help="directory for the table and summary files")
    p.add_argument("--format", default="table", choices=("table", "csv", "json", "parquet"),
                   help="table (terminal) or a file format (written to --out, else printed)")
    p.add_argument("--plot", metavar="DIR", help="write ESD and depth plots (PNG) here")
    p.add_argument("--report", metavar="FILE.html", help="write a self-contained HTML report")
    p.add_argument("--base", metavar="PATH",
                   help="analyse what fine-tuning changed: each PATH minus this checkpoint "
                        "(W - W_base, parameters of the same name and shape)")
    p.add_argument("--views", metavar="RULE,...",
                   help="split parameters into views analysed on their own: heads, qkv, "
                        "experts, conv (diffractml-views; `diffract plugins` lists the rules)")
    p.add_argument("--view-option", dest="view_options", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="an option of the view rules (repeatable; heads=12, kv_heads=4, "
                        "head_dim=64, experts=8...; VALUE is JSON or a bare word); the "
                        "geometry comes from config.json when there is one")
    p.add_argument("--step-from", metavar="REGEX",
                   help="the training step of each PATH: a regular expression with one group "
                        "searched in the path (default: trainer_state.json, else names such "
                        "as step-1000, checkpoint-1000, global_step1000, iter_0001000)")
    p.add_argument("--key", metavar="NAME",
                   help="the entry of a torch training checkpoint that holds the state dict "
                        "(when several do: 'model', 'ema'...)")
    p.add_argument("--lora", action="store_true",
                   help="each PATH is a PEFT LoRA adapter (directory or adapter_model "
                        "file): analyse its updates scale * B @ A")
    p.add_argument("--include-1d", action="store_true",
                   help="show 1-D parameters (biases, norms) in the table")
    p.add_argument("--storage-option", dest="storage_options", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="an option of the object store's file system for s3://, gs://, hf:// "
                        "paths (diffractml-sources-fsspec; repeatable: endpoint_url=URL, "
                        "anon=true, client_kwargs.region_name=eu-west-1; VALUE is JSON or a "
                        "bare word). Credentials come from where the store's library reads "
                        "them (the environment, its config files)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


# -- inputs ------------------------------------------------------------------------------
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
#: ``org/name[@revision]``: a hub's model id, when no such path exists.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(?:@[\w./-]+)?")


def _load_factory(spec: str) -> Any:
    import importlib

    module_name, _, attr = spec.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"{printable(spec)}: cannot import module {module_name!r} ({exc}). Give a "
                         "module importable from here (or a file path).") from None
    finally:
        sys.path.pop(0)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{printable(spec)}: module {module_name!r} has no {attr!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{printable(spec)}: {attr!r} is not callable; name a function "
                         "that returns an nn.Module.")
    return obj()


def is_checkpoint(path: Path) -> bool:
    """Whether an installed model format reads ``path`` (a file by its suffix or first
    bytes, a directory by its layout)."""
    from diffract.plugins import get_catalog

    return any(f.recognises(path) for f in get_catalog().formats.values())


def checkpoints_inside(folder: Path) -> list[Path]:
    """The checkpoints directly inside ``folder``, by name."""
    return sorted(p for p in folder.iterdir() if is_checkpoint(p))


def _refuse_a_folder_of_checkpoints(raw: str, folder: Path) -> None:
    """A folder given as one model that holds checkpoints (a run's ``step-*.pt``, a
    trainer's ``checkpoint-*/``) is refused with what to type instead; any other folder
    is left to the formats, whose message says what a checkpoint directory holds."""
    def by_step(name: str) -> tuple[bool, int, str]:  # the number in the name, as track
        found = re.findall(r"\d+", Path(name).stem)  # orders step-50 before step-100
        return not found, int(found[-1]) if found else 0, name

    inside = sorted((p.name for p in checkpoints_inside(folder)), key=by_step)
    if inside:
        shown = printable(", ".join(inside[:3]) + (f", ... {inside[-1]}" if len(inside) > 3
                                                   else ""))
        quoted = printable(shlex.quote(raw.rstrip("/") or "/"))
        store = printable(shlex.quote((raw.rstrip("/") or "run") + ".diffract"))
        raise UsageError(
            f"{printable(raw)}: a folder of {len(inside)} checkpoint(s) ({shown}), not one "
            f"checkpoint. Give them one by one ({quoted}/* for all), or track them as one training "
            f"run's steps: diffract track {quoted} --store {store}")


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """--storage-option KEY=VALUE as a mapping (dotted keys nest: ``client_kwargs.x=1``)."""
    out: dict[str, Any] = {}
    for text in getattr(args, "storage_options", None) or ():
        key, sep, value = text.partition("=")
        if not sep or not key.strip() or any(not k for k in key.strip().split(".")):
            raise UsageError(f"--storage-option {printable(text)!r}: expected KEY=VALUE "
                             "(endpoint_url=http://127.0.0.1:9000, anon=true).")
        *outer, last = key.strip().split(".")
        node = out
        for part in outer:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UsageError(f"--storage-option {printable(text)!r}: {part!r} is given "
                                 "a value and options both.")
        node[last] = parse_setting(f"x.{last}={value}")[2]
    return out


def url_options(what: Any, storage: dict[str, Any]) -> dict[str, Any]:
    """models.add's format options for a URL given --storage-option (else none)."""
    from diffract.plugins import url_scheme

    return {"format_options": {"storage_options": storage}} if storage and url_scheme(
        what) else {}


def object_checkpoints(pattern: str, storage: dict[str, Any]) -> list[str]:
    """The checkpoints a URL pattern names, from the format that reads its scheme."""
    from diffract.errors import ModelSourceError
    from diffract.plugins import url_format

    try:
        fmt = url_format(pattern, None)
        found = fmt.glob(pattern, **({"storage_options": storage} if storage else {}))
    except ModelSourceError as exc:
        raise UsageError(str(exc)) from None
    if not found:
        raise UsageError(f"{printable(pattern)}: matches no checkpoint in object storage (no "
                         "safetensors object or folder, no DCP folder there).")
    return found


def model_inputs(paths: Sequence[str]) -> list[tuple[str, Any, str | None]]:
    """(model_id, what to add, file path or None) per PATH; ids from file names."""
    from diffract.plugins import url_scheme

    out: list[tuple[str, Any, str | None]] = []
    taken: set[str] = set()
    for raw in paths:
        path = Path(raw)  # os.path's tests: False for a name too long for the file system
        if not url_scheme(raw) and os.path.isdir(raw) and not is_checkpoint(path):
            _refuse_a_folder_of_checkpoints(raw, path)
        what: Any
        file: str | None
        if url_scheme(raw):  # read in place by the format of its scheme
            what = file = raw.rstrip("/")
            if not raw.partition("://")[2].strip("/") or raw.partition("://")[2][:1] == "/":
                raise UsageError(f"{printable(raw)}: names no bucket: give "
                                 f"{raw.partition('://')[0]}://BUCKET/PATH/TO/CHECKPOINT.")
            parts = what.split("://", 1)[1].split("/")
            stem = parts[-1].removesuffix(".safetensors")
            if stem == "model" and len(parts) > 2:
                stem = parts[-2]
        elif os.path.exists(raw):
            stem = path.name if path.is_dir() else path.stem
            what = str(path.resolve())
            file = what
            if stem in ("model", "pytorch_model") and path.parent.name:
                stem = path.resolve().parent.name  # model.safetensors: use its folder
        elif _FACTORY.match(raw):
            stem = raw.rsplit(":", 1)[1].rsplit(".", 1)[-1]
            what, file = _load_factory(raw), None
        elif _HUB_ID.fullmatch(raw):  # a model id: the formats find it (the local cache)
            stem, what, file = raw.split("@", 1)[0].rsplit("/", 1)[1], raw, None
        else:
            raise UsageError(f"{printable(raw)}: no such file or directory. Give a .safetensors "
                             "file, a checkpoint directory, a torch state-dict file, a Hugging "
                             "Face model id (org/name) in the local cache, or module:factory.")
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
    return kernel, key, _json(value, text)


def _json(value: str, text: str) -> Any:
    """``value`` as JSON, else the string itself; one nested past Python's recursion limit
    (100,000 ``[``) is a UsageError, not a traceback."""
    try:
        return json.loads(value)
    except ValueError:
        return value
    except RecursionError:
        raise UsageError(f"{printable(text[:40])}...: the value nests too deeply (lists or "
                         "objects inside each other past what JSON readers take).") from None


def _regex(text: str | None, flag: str) -> Any:
    from diffract.errors import InvalidArgumentError
    from diffract.plugins import name_pattern

    if text is None:
        return None
    try:
        return name_pattern(text, flag)
    except InvalidArgumentError as exc:
        raise UsageError(str(exc)) from None


def check_metrics(session: Any, metrics: Sequence[str]) -> None:
    """Every metric produced by an installed kernel (or an alias of one), or an error
    naming the pack."""
    known = set(session.compute.list_available_metrics()) | set(session.registry.aliases())
    for field in metrics:
        if field in known:
            continue
        conflict = session.registry.conflict(field)
        if conflict is not None:  # installed twice, not missing: say who claims it
            raise UsageError(f"Metric {field!r}: {conflict}")
        pack = provider_of("fields", field)
        if pack is not None:
            raise UsageError(f"Metric {field!r} comes from {pack}, which is not installed: "
                             f"{install_hint(pack)}.")
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
    # --store names where a command writes: a new path there is meant (and a command
    # refused before it wrote anything says why itself), not a mistyped store to read
    warnings.filterwarnings("ignore", message="No store was at ", category=DiffractWarning)
    return Session(profile=profile, config=config or None, **kwargs, **options)


def view_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """``views`` and ``view_options`` for models.add from --views and --view-option."""
    if args.views is not None and not [v for v in args.views.split(",") if v.strip()]:
        raise UsageError(f"--views {args.views!r} names no view rule; give one or more of "
                         "heads, qkv, experts, conv (diffract plugins lists those installed).")
    if not args.views:
        if args.view_options:
            raise UsageError("--view-option needs --views.")
        return {}
    options = {}
    for text in args.view_options:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--view-option {text!r}: expected KEY=VALUE (heads=12).")
        options[key.strip()] = _json(value, text)
    return {"views": args.views, "view_options": options}


_PY_OPTION = re.compile(r"""view_options=\{["'](\w+)["']: ([^,}]+)\}""")


def shell_words(text: str) -> str:
    """A message of the Python API in the command line's words: ``view_options={"heads":
    N}`` becomes ``--view-option heads=N``, ``view_options`` ``--view-option``."""
    text = _PY_OPTION.sub(r"--view-option \1=\2", text)
    return re.sub(r"\bview_options\b", "--view-option", text).replace("views=[...]",
                                                                      "--views")


def _add(session: Any, what: Any, model_id: str, views: dict[str, Any], **kwargs: Any) -> None:
    """models.add; without --views, with the experts rule where it applies: a stack of
    packed experts is analysed per expert by default (as one matrix it has no spectrum),
    and a model with none is added whole (the rule then refuses it: split nothing)."""
    from diffract.plugins import get_catalog

    if views or "experts" not in get_catalog().views:
        session.models.add(what, model_id=model_id, **views, **kwargs)
        return
    try:
        session.models.add(what, model_id=model_id, views=["experts"], **kwargs)
    except ModelSourceError:  # no stack the rule splits (or one it cannot): whole
        session.models.add(what, model_id=model_id, **kwargs)


def add_models(session: Any, inputs: Sequence[tuple[str, Any, str | None]], *,
               base: str | None = None, lora: bool = False, key: str | None = None,
               views: dict[str, Any] | None = None, step_from: str | None = None,
               storage: dict[str, Any] | None = None) -> list[str]:
    """Add each model (a delta against model ``base``, or LoRA updates), or reuse it when
    a durable store already holds it from the same file (a resumed run)."""
    held = {r["model_id"]: r for r in session.models.list()}
    derived = base is not None
    for model_id, what, file in inputs:
        if model_id in held:
            if file is not None and held[model_id]["source"] == file:
                continue  # resuming: the store has it, and its files are checked on read
            if derived and model_id != base:
                continue  # resuming a delta model (stored as computed)
            raise UsageError(
                f"The store already holds a model {model_id!r} from "
                f"{held[model_id]['source']}, not from {file or 'this factory'}. Use another "
                "--store, or rename the file."
            )
        try:
            if lora:
                session.models.add_lora(what, model_id)
            else:
                _add(session, what, model_id, views or {}, base_model_id=base,
                     key=key if file is not None else None, step_from=step_from,
                     **url_options(what, storage or {}))
        except (InvalidArgumentError, ModelSourceError) as exc:  # in the shell's words
            raise UsageError(shell_words(str(exc))) from None
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
        add_models(session, [(base, base_what, base_file)], key=args.key,
                   views=view_arguments(args), storage=storage_options(args))
    added = add_models(session, inputs, base=base, lora=args.lora, key=args.key,
                       views=view_arguments(args), step_from=args.step_from,
                       storage=storage_options(args))
    return session.models.ordered(added)  # by training step where there is one


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


def parents_only(session: Any, view: Any, model_ids: Sequence[str]) -> Any:
    """``view`` without the parameters' views (the default metrics are the parents')."""
    return view.filter(param_names=[p.name for m in model_ids for p in session.models.params(m)
                                    if p.parent is None])


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
