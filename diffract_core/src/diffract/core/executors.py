"""The core's executors for PARALLEL kernels, and the handle that keeps one dependable.

An executor is a factory returning a ``concurrent.futures.Executor``-shaped object:
``sequential`` (in the calling thread), ``threads`` and ``processes`` here; ``dask`` from
the diffractml-executor-dask plugin. Processes are spawned (forking a process that runs
threads can deadlock; spawned workers import kernels by their module path), and each
limits its BLAS, OpenMP and torch threads to its share of the cores.

:class:`ExecutorHandle` is what a session holds: it creates the executor on first use,
replaces it when a worker died or hung (terminating what is left of the old one), and
shuts it down without waiting for workers that do not stop."""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

__all__ = [
    "ExecutorHandle", "InlineExecutor", "check_process_options", "spawn_problem",
    "limit_threads", "one_openmp_thread", "process_executor", "sequential_executor",
    "thread_executor",
]

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


class InlineExecutor(Executor):
    """Runs each task at submit time in the calling thread."""

    inline = True

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            future.set_exception(exc)
        return future


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def limit_threads(threads: int) -> None:
    """In a worker: at most ``threads`` BLAS/OpenMP/torch threads (its share of the cores)."""
    for var in _THREAD_VARS:
        os.environ[var] = str(threads)
    with contextlib.suppress(ImportError):
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def one_openmp_thread() -> None:
    """In an analysis's own thread: its OpenMP regions (torch on the CPU) on one thread. A
    team per thread makes GNU OpenMP stop spin-waiting for all teams, a training loop's too
    (each step 1.3-2x slower on 2 cores); torch's per-thread set-up would undo it, so first."""
    torch = sys.modules.get("torch")
    if torch is None:
        return  # numpy's BLAS runs threads of its own, not OpenMP's
    torch.get_num_threads()
    with contextlib.suppress(ImportError):
        _openmp().limit(limits=1)


@functools.lru_cache(maxsize=1)
def _openmp() -> Any:
    """The OpenMP runtimes loaded (torch's), found once: the search is 1.5 ms a thread."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="openmp")


def watch_parent(parent: int, interval: float = 0.5) -> None:
    """In a worker: exit once ``parent`` is gone (a killed session leaves no workers
    holding its files); a daemon thread polls its pid and our parent."""
    def alive() -> bool:
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            return False
        except OSError:  # exists, not ours to signal
            pass
        return os.getppid() == parent

    def watch() -> None:
        while alive():
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="diffract-parent-watch", daemon=True).start()


def _worker_start(threads: int, parent: int) -> None:
    # Ctrl-C reaches the whole process group (a terminal, a Jupyter kernel shutting
    # down): the session stops its workers itself, so they ignore it, with no traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit_threads(threads)
    watch_parent(parent)


def sequential_executor(config: Any, options: Mapping[str, Any]) -> Executor:
    return InlineExecutor()


def thread_executor(config: Any, options: Mapping[str, Any]) -> Executor:
    return ThreadPoolExecutor(
        max_workers=int(options.get("max_workers", config.process_workers)),
        thread_name_prefix="diffract-kernel", initializer=one_openmp_thread)


def check_process_options(config: Any, options: Mapping[str, Any]) -> list[str]:
    """Problems with the ``processes`` executor's options (checked when a session opens)."""
    problems = []
    unknown = sorted(set(options) - {"max_workers", "start_method"})
    if unknown:
        problems.append(f"unknown option(s) {unknown}; it accepts max_workers, start_method")
    workers = options.get("max_workers", config.process_workers)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        problems.append(f"max_workers must be an integer >= 1, got {workers!r}")
    if "start_method" in options:  # spawn, the default, exists everywhere
        import multiprocessing  # 10 ms of every start otherwise

        method, methods = options["start_method"], multiprocessing.get_all_start_methods()
        if method not in methods:
            problems.append(f"start_method {method!r} is not available here; choose one of "
                            f"{methods}")
    return problems


def process_executor(config: Any, options: Mapping[str, Any]) -> Executor:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor  # 10 ms: only when a pool is made

    workers = int(options.get("max_workers", config.process_workers))
    return ProcessPoolExecutor(
        workers, multiprocessing.get_context(options.get("start_method", "spawn")),
        initializer=_worker_start, initargs=(max(1, cpus() // workers), os.getpid()))


@functools.lru_cache(maxsize=8)
def _has_main_guard(path: str) -> bool:
    """Whether a script has an ``if __name__ == "__main__":`` block (parsed once: a
    training monitor asks at every apply)."""
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return True  # cannot tell: do not stop the user
    return any("__name__" in [n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)]
               and "__main__" in [c.value for c in ast.walk(node.test)
                                  if isinstance(c, ast.Constant)]
               for node in ast.walk(tree)
               if isinstance(node, ast.If) and isinstance(node.test, ast.Compare))


def spawn_problem(function: Callable[..., Any]) -> str | None:
    """Why spawned workers cannot run ``function`` for this program (a phrase ending
    with the fix), or None: a program read from standard input, a kernel defined in a
    main program with no file (``-c``, a notebook), a script without an ``if __name__ ==
    "__main__":`` guard (every worker would run it again), or a worker itself."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    mp = sys.modules.get("multiprocessing")  # a spawned worker has it imported
    if mp is not None and mp.parent_process() is not None:
        return "this is a worker process; to use a pool, start it from the main program"
    if path is not None and not os.path.exists(path):  # python - < script: "<stdin>"
        return (f"this program was read from standard input ({path}), which spawned workers "
                "cannot start from; to use the pool, save it as a script with an "
                "'if __name__ == \"__main__\":' guard")
    code = getattr(function, "__code__", None)
    if getattr(function, "__module__", None) == "__main__" and (
            path is None or code is None
            or os.path.abspath(code.co_filename) != os.path.abspath(path)):
        name = getattr(function, "__qualname__", repr(function))
        return (f"kernel {name!r} is defined in a main program with no file of its own (code "
                "given with -c, a notebook, an interactive session), which workers cannot "
                "import; to use the pool, define it in an importable module")
    if path is None:
        return None
    from_top_level = any(
        f.f_globals.get("__name__") == "__main__" and f.f_code.co_name == "<module>"
        for f, _ in traceback.walk_stack(None)
    )
    if from_top_level and not _has_main_guard(path):
        return (f"{os.path.basename(path)!r} has no 'if __name__ == \"__main__\":' guard, so "
                "every worker would run the script again; to use the pool, put the script's "
                "work under that guard")
    return None


def _worker_ready(modules: tuple[str, ...], pause: float) -> int:
    for module in modules:
        importlib.import_module(module)
    time.sleep(pause)
    return os.getpid()


@contextlib.contextmanager
def _interrupt_after():
    """Hold Ctrl-C until the block ends (a worker started just before it would miss its
    start-up data); blocked here too, so a worker starts with it blocked."""
    came: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    if previous is None:  # not the main thread, or a handler Python did not set
        yield
        return
    blocks = hasattr(signal, "pthread_sigmask")  # POSIX
    signal.signal(signal.SIGINT, lambda number, frame: came.append(number))
    if blocks:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if blocks:  # one held by the mask is handled now, by the handler above
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, previous)
    if came:
        signal.raise_signal(signal.SIGINT)


class ExecutorHandle:
    """The session's executor: built on first use, replaced when broken, stopped hard.

    ``factory()`` builds a fresh executor. ``replace()`` stops the current one (its
    queued work cancelled, its worker processes terminated: a dead or hung worker
    leaves a process pool unusable) and the next ``get()`` builds another."""

    def __init__(self, name: str, factory: Callable[[], Executor], *, spawns: bool = False,
                 inline: bool = False, reads_files: bool | str | None = None) -> None:
        self.name = name
        self._factory = factory
        self._executor: Executor | None = None
        #: Whether it starts worker processes on this machine / runs in the calling
        #: thread (known before it is built: building a cluster costs seconds).
        self.spawns = spawns
        self.inline = inline
        #: Whether workers read file-backed weights themselves (sent references): True,
        #: "urls" (those in object storage only: a remote cluster's), or False (shipped).
        self.reads_files = spawns if reads_files is None else reads_files

    def get(self) -> Executor:
        if self._executor is None:
            self._executor = self._factory()
            with contextlib.suppress(AttributeError):  # not warmed yet (see warm)
                self._executor._diffract_warm = set()  # type: ignore[attr-defined]
        return self._executor

    def replace(self) -> None:
        self.shutdown(cancel=True)

    def warm(self, modules: tuple[str, ...] = ()) -> None:
        """Wait until each worker process of a fresh pool has answered, with ``modules``
        (a kernel's) imported (an event, not a time): a unit timeout counts from the
        result's wait, which must not include spawning and importing, seconds on a busy
        machine."""
        ex = self.get()
        warmed, wanted = getattr(ex, "_diffract_warm", None), {"", *modules}
        if not self.spawns or warmed is None or wanted <= warmed:  # "": the pool is up
            return
        workers, seen = int(getattr(ex, "_max_workers", 1)), set()
        for _ in range(50):  # short naps spread the answers over the workers
            with _interrupt_after():  # a submit can start a worker
                futures = [ex.submit(_worker_ready, modules, 0.05) for _ in range(2 * workers)]
            seen |= {f.result() for f in futures}
            if len(seen) >= workers:
                break
        warmed.update(wanted)

    def shutdown(self, *, cancel: bool = False, grace: float = 2.0) -> None:
        """Stop the executor. With ``cancel``, queued work is dropped and worker
        processes that are still running after ``grace`` seconds are terminated."""
        ex, self._executor = self._executor, None
        if ex is None:
            return
        if not cancel:
            ex.shutdown(wait=True)
            return
        processes = list((getattr(ex, "_processes", None) or {}).values())
        with contextlib.suppress(Exception):
            ex.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + grace
        for proc in processes:
            with contextlib.suppress(Exception):
                proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in processes:
            with contextlib.suppress(Exception):
                if proc.is_alive():
                    proc.terminate()
                    proc.join(timeout=1.0)
                if proc.is_alive():
                    proc.kill()
