"""PARALLEL kernels on Ray: the cluster this process is already connected to, a cluster
by address, or a local one started on first use (and stopped at the session's end).

:class:`RayExecutor` is a ``concurrent.futures.Executor``: ``submit`` sends the kernel
(a top-level function of an importable module, pickled by reference; the workers must
have it installed) and its inputs as one Ray task of one CPU, and returns the task's
future; a task whose worker dies is run again by Ray (``max_retries``), and
``shutdown(cancel_futures=True)`` cancels what is queued. A cluster Diffract starts has
no dashboard and sends no usage report (``RAY_USAGE_STATS_ENABLED=0`` unless set), and
its workers see this process's import path, as the ``processes`` executor's do. Ray
gives each task of one CPU ``OMP_NUM_THREADS=1``: the workers do not oversubscribe the
cores with BLAS threads.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from diffract.errors import ExecutorError

__all__ = ["RayExecutor", "check_options"]

_OPTIONS = ("address", "num_cpus", "read_files", "max_retries", "runtime_env")


def check_options(config: Any, options: Mapping[str, Any]) -> list[str]:
    """Problems with the ``ray`` executor's options."""
    problems = []
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        problems.append(f"unknown option(s) {unknown}; it accepts {list(_OPTIONS)}")
    address = options.get("address")
    if address is not None and not isinstance(address, str):
        problems.append(f"address must be a Ray address string ('auto', 'ray://host:10001', "
                        f"'host:6379'), got {address!r}")
    cpus = options.get("num_cpus", config.process_workers)
    if not isinstance(cpus, int) or isinstance(cpus, bool) or cpus < 1:
        problems.append(f"num_cpus must be an integer >= 1, got {cpus!r}")
    for flag in ("read_files",):
        if flag in options and not isinstance(options[flag], bool):
            problems.append(f"{flag} must be true or false, got {options[flag]!r}")
    retries = options.get("max_retries", 3)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        problems.append(f"max_retries must be an integer >= 0, got {retries!r}")
    env = options.get("runtime_env")
    if env is not None and not isinstance(env, Mapping):
        problems.append(f"runtime_env must be a table (Ray's runtime_env), got {env!r}")
    elif env is not None:
        variables = env.get("env_vars", {})
        if not isinstance(variables, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in variables.items()):
            problems.append("runtime_env.env_vars must be a table of names to strings, got "
                            f"{variables!r}")
        bad = [k for k in ("pip", "conda", "py_modules", "working_dir", "excludes")
               if k in env and not isinstance(env[k], (str, list, Mapping))]
        problems += [f"runtime_env.{k} must be a string, a list or a table (Ray's "
                     f"runtime_env), got {env[k]!r}" for k in bad]
    if isinstance(address, str):
        problem = _address_problem(address)
        if problem:
            problems.append(problem)
    return problems


def _address_problem(address: str) -> str | None:
    """Why ``address`` is no Ray address, or None."""
    if address in ("auto", "local"):
        return None
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536 or \
            not host.isascii() or any(c.isspace() or c in "/@" for c in host):
        return (f"the Ray address {address!r} is not host:port, ray://host:port or 'auto' "
                "(an ASCII host and a port from 1 to 65535); give one of those")
    return None


def _local(options: Mapping[str, Any]) -> bool:
    """Whether the workers run on this machine: no address, and no cluster connected."""
    if options.get("address") is not None:
        return False
    ray = sys.modules.get("ray")
    return not (ray is not None and ray.is_initialized())


def spawns(options: Mapping[str, Any]) -> bool:
    """Ray's workers import the kernels' modules, never this program's ``__main__``:
    no ``if __name__ == "__main__":`` guard is needed."""
    return False


def reads_files(options: Mapping[str, Any]) -> bool | str:
    """What the workers read themselves (sent references, not data): a local cluster's
    every checkpoint; a remote one's those in object storage ("urls": each worker
    reaches the store, with its own credentials), its files only when told so
    (``read_files=true``: every worker mounts them at the same path);
    ``read_files=false``: nothing, every weight is shipped from here."""
    if "read_files" in options:
        return bool(options["read_files"])
    return True if _local(options) else "urls"


def _reachable(address: str | None, timeout: float = 5.0) -> None:
    """An ExecutorError at once when nothing listens at a ``host:port`` address (Ray
    itself retries for minutes, printing a line every few seconds)."""
    if address is None or address in ("auto", "local"):
        return
    problem = _address_problem(address)
    if problem:
        raise ExecutorError(problem + ".")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ExecutorError(
            f"no Ray cluster answers at {address!r} ({exc.strerror or type(exc).__name__}): "
            "start one there (`ray start --head`), give its address, or leave address out "
            "for a local Ray.") from None


#: Seconds ``ray.init`` may take to connect to a cluster by address (a listener that
#: accepts the connection and never speaks Ray held it past 300 s); the environment's
#: DIFFRACT_RAY_CONNECT_TIMEOUT sets it.
CONNECT_TIMEOUT = 60.0


def _init_within(ray: Any, address: str | None, kwargs: dict[str, Any]) -> None:
    """``ray.init(**kwargs)``; connecting to ``address``, given up past the limit with an
    ExecutorError naming it. A local start is interrupted cleanly: Ctrl-C while it comes
    up stops what it started (its agents included) before the KeyboardInterrupt goes on."""
    if address is None:
        seen: dict[int, float] = {}  # every process the start made, as it appears: Ray's
        done = threading.Event()  # own clean-up of an interrupted start kills the raylet
        watcher = threading.Thread(target=_watch, args=(seen, done), daemon=True)  # and
        watcher.start()  # orphans its agents, which no tree walk finds afterwards
        reaper = _subreaper(True)  # orphans of the start come back to this process
        try:
            ray.init(**kwargs)
        except BaseException:
            done.set()
            watcher.join()
            _stop_local(ray, seen)
            raise
        finally:
            done.set()
            if reaper:
                _subreaper(False)
        return
    raw = os.environ.get("DIFFRACT_RAY_CONNECT_TIMEOUT", "")
    try:
        limit = float(raw) if raw else CONNECT_TIMEOUT
    except ValueError:
        limit = -1.0
    if not 0 < limit < float("inf"):
        raise ExecutorError(f"DIFFRACT_RAY_CONNECT_TIMEOUT takes seconds above 0, got {raw!r}.")
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            ray.init(**kwargs)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome.append(exc)

    thread = threading.Thread(target=connect, name="diffract-ray-connect", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        raise ExecutorError(
            f"the Ray cluster at {address!r} did not answer within {limit:g} s "
            "(DIFFRACT_RAY_CONNECT_TIMEOUT): something listens there that is not a Ray head "
            "answering; check the address (the head's GCS port, 6379 by default, or "
            "ray://host:10001 for Ray Client).")
    if outcome and outcome[0] is not None:
        raise outcome[0]


def _subreaper(on: bool) -> bool:
    """Make this process (Linux) the one orphaned descendants are given to, or stop; True
    where it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, int(on), 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _watch(seen: dict[int, float], done: threading.Event) -> None:
    """Record every process under this one (pid -> its start time) until ``done``."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with ray
        return
    me = psutil.Process()
    while not done.wait(0.05):
        try:
            for child in me.children(recursive=True):
                seen.setdefault(child.pid, child.create_time())
        except psutil.Error:
            continue


def _stop_local(ray: Any, seen: Mapping[int, float]) -> None:
    """Stop what an interrupted local ``ray.init`` started: ``ray.shutdown()`` (which knows
    the node once it exists), then every process the start made that still runs (the
    raylet's dashboard and runtime-env agents outlived the command otherwise; a pid is
    taken for the same process only with the same start time)."""
    import contextlib

    with contextlib.suppress(Exception):
        ray.shutdown()
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with ray
        return
    handled: set[int] = set()
    for _ in range(5):  # again while the raylet's last children come back to us
        left = []
        with contextlib.suppress(psutil.Error):
            left = [p for p in psutil.Process().children(recursive=True)
                    if p.pid not in handled]
        for pid, started in seen.items():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.create_time() == started and pid not in handled and all(
                        p.pid != pid for p in left):
                    left.append(proc)
        if not left:
            return
        for proc in left:
            handled.add(proc.pid)
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(left, timeout=5)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fn(*args, **kwargs)


_REMOTE: dict[str, Any] = {}
_LOCK = threading.Lock()


def _remote_call() -> Any:
    import ray

    with _LOCK:
        if "call" not in _REMOTE:
            _REMOTE["call"] = ray.remote(num_cpus=1)(_call)
        return _REMOTE["call"]


class RayExecutor(cf.Executor):
    """A concurrent.futures executor over Ray tasks."""

    def __init__(self, *, address: str | None = None, num_cpus: int = 2, max_retries: int = 3,
                 runtime_env: Mapping[str, Any] | None = None) -> None:
        import ray

        self._started = False
        if not ray.is_initialized():
            _reachable(address)
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            env = dict(runtime_env or {})
            if address is None:  # a local cluster: its workers import what this process can
                paths = [p for p in sys.path if p and os.path.isdir(p)]
                env.setdefault("env_vars", {})
                env["env_vars"] = {"PYTHONPATH": os.pathsep.join(paths), **env["env_vars"]}
            try:
                _init_within(ray, address, dict(
                    address=address, num_cpus=num_cpus if address is None else None,
                    include_dashboard=False, logging_level=logging.ERROR,
                    log_to_driver=False, runtime_env=env or None))
            except (ConnectionError, RuntimeError, ValueError, TypeError) as exc:
                raise ExecutorError(
                    f"Ray could not {'connect to ' + repr(address) if address else 'start'}"
                    f": {str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}. "
                    "Start a cluster there (`ray start --head`), give its address, or leave "
                    "address out for a local Ray.") from None
            self._started = True
        self._retries = max_retries
        self._pending: set[Any] = set()
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        ref = _remote_call().options(max_retries=self._retries).remote(fn, args, kwargs)
        future = ref.future()
        with self._lock:
            self._pending.add(ref)
        future.add_done_callback(lambda _: self._done(ref))
        return future

    def _done(self, ref: Any) -> None:
        with self._lock:
            self._pending.discard(ref)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        import ray

        with self._lock:
            pending = list(self._pending)
        if cancel_futures:
            for ref in pending:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
        elif wait and pending:
            with contextlib.suppress(Exception):
                ray.wait(pending, num_returns=len(pending))
        if self._started:
            with contextlib.suppress(Exception):
                ray.shutdown()


def ray_executor(config: Any, options: Mapping[str, Any]) -> RayExecutor:
    return RayExecutor(address=options.get("address"),
                       num_cpus=int(options.get("num_cpus", config.process_workers)),
                       max_retries=int(options.get("max_retries", 3)),
                       runtime_env=options.get("runtime_env"))
