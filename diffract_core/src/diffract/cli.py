"""The ``diffract`` command: a host whose subcommands are records plugins yield.

The core's own are ``plugins`` and ``kernels [-v]`` (in :mod:`diffract.plugins._builtin`);
others arrive through the ``diffract_commands`` hook (``analyze``, ``compare``, ``track``,
``catalog`` and ``demo`` from diffractml-report). Only the command being run has its
arguments built (so only its plugin's modules are imported); it gets the process's
catalog and kernel registry as ``args.catalog`` and ``args.registry``. Exit codes: 0
done, 1 some work failed, 2 usage errors."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from diffract.plugins._manager import Catalog


def _missing(name: str, catalog: Catalog) -> str | None:
    """Why command ``name`` is not available, with what to do, or None (a typo)."""
    contested = catalog.conflict_message("commands", name)
    if contested is not None:
        return f"command {contested}"
    from diffract.errors import install_hint, provider_of

    dist = provider_of("commands", name)
    if dist is None:
        return None
    return (f"the {name!r} command comes from the {dist} distribution, which is not installed "
            f"(or is disabled by DIFFRACT_PLUGINS/DIFFRACT_DISABLE_PLUGINS): "
            f"{install_hint(dist)}")


class _Versions(argparse.Action):
    """``--version``: each installed distribution of this project (``diffractml-*``)."""

    def __init__(self, option_strings: list[str], dest: str, **_: Any) -> None:
        super().__init__(option_strings, dest, nargs=0,
                         help="show each installed distribution of Diffract and its version")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib import metadata

        from diffract import __version__
        from diffract.errors import printable

        mine = sorted({(printable(d.metadata["Name"]), printable(d.version))
                       for d in metadata.distributions()
                       if str(d.metadata["Name"]).lower().startswith("diffractml-")})
        width = max((len(n) for n, _ in mine), default=0)
        print("\n".join([f"diffract {__version__}", *(f"  {n:{width}}  {v}" for n, v in mine)]))
        parser.exit()


def _run(argv: list[str], chosen: str | None) -> int:
    from diffract.plugins._runtime import get_catalog, get_registry

    catalog = get_catalog()
    if chosen is not None and chosen not in catalog.commands:
        why = _missing(chosen, catalog)
        if why is not None:
            print(f"diffract: error: {why}.", file=sys.stderr)
            return 2
    parser = argparse.ArgumentParser(
        prog="diffract", description="Metrics on every parameter of neural-network checkpoints.")
    parser.add_argument("--version", action=_Versions)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in sorted(catalog.commands.items()):
        p = sub.add_parser(name, help=command.help,
                           description=command.description or command.help)
        if name == chosen:  # only the command being run builds its arguments
            command.configure(p)
            p.set_defaults(run=command.run)
    args = parser.parse_args(argv)
    args.catalog, args.registry = catalog, get_registry()
    return int(args.run(args))


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be, so it stops a command the same way."""


def main(argv: Sequence[str] | None = None) -> int:
    """The ``diffract`` command. Ctrl-C and SIGTERM stop it the same way (what is
    committed stays, a message, exit 130 and 143); also during start-up and close."""
    import signal
    import warnings

    from diffract.errors import DiffractError, DiffractWarning, printable

    # numpy and the plugin layer load before Ctrl-C becomes a KeyboardInterrupt: one
    # raised inside numpy's C set-up comes out as an ImportError (a traceback, exit 1);
    # until here the launcher's handler ends the process with 130
    from diffract.plugins import _runtime  # noqa: F401

    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    name = f"diffract {chosen}" if chosen else "diffract"
    terminated: list[int] = []

    def on_term(signum: int, frame: Any) -> None:
        terminated.append(signum)
        raise _Terminated

    try:  # (the launcher held them while starting: see _diffract_launch)
        previous = signal.signal(signal.SIGTERM, on_term)
        previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread: leave signals alone
        previous = previous_int = None
    try:
        with warnings.catch_warnings():
            # ours once each, others as Python decides; no file or line the user never wrote
            warnings.simplefilter("default", DiffractWarning)
            warnings.showwarning = lambda message, category, *_, **__: print(
                f"{category.__name__}: " + printable(str(message), "\n"), file=sys.stderr)
            code = _run(argv, chosen)
    except KeyboardInterrupt:
        print(f"{name}: interrupted; what was committed is kept.", file=sys.stderr)
        code = 130
    except DiffractError as exc:
        print(f"{name}: error: " + printable(str(exc), keep="\n"), file=sys.stderr)
        code = 2
    except BrokenPipeError:  # `diffract kernels -v | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)
    return 128 + signal.SIGTERM if terminated and code == 130 else code


def exit_process(code: int) -> int:
    """The ``diffract`` command's exit: atexit handlers run, stdio flushed, then the
    process ends without finalizing the interpreter (numpy's, OpenBLAS's and every
    module's teardown: 40-60 ms of a 0.8 s ``diffract analyze``). While another thread
    runs, ``code`` is returned for ``sys.exit`` (finalization joins it), unless it was
    stopped (130, 143): a KeyboardInterrupt through a C extension's ``PyRun_String``
    leaves a flag that, under ``-m``, has CPython end with SIGINT (-2, not 130)."""
    import threading

    if code not in (130, 143) and threading.active_count() > 1:
        return code
    import atexit
    import os

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(exit_process(main()))
