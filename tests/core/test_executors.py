"""The process pool, dependable: dead and hung workers, Ctrl-C, spawn safety, options
checked when the session opens, thread limits per worker, progress events."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from diffract import KernelExecutionProtocol, Session
from diffract.errors import ApplyError, ExecutorError, UnknownExecutorError
from tests.resources import kernels as test_kernels

ROOT = Path(__file__).resolve().parents[2]
PARALLEL = KernelExecutionProtocol.PARALLEL


def _pool(**parallel):
    return {"parallel": {"executor": "processes", "pool_min_seconds": 0,
                         "process_pool": {"max_workers": 2}, **parallel}}


def _model(n=6):
    out = {f"p{i}": np.full((3, 3), float(i)) for i in range(n)}
    out["victim"] = np.ones((7, 7))
    return out


class TestDeadWorkers:
    def test_a_worker_killed_once_is_replaced_and_its_units_run_again(self, tmp_path):
        """SIGKILL of a worker: the pool is replaced, the lost units run again, nothing
        fails; a later PARALLEL apply in the same session works."""
        with Session(config=_pool()) as s:
            s.compute.kernel(name="t_die", execution_protocol=PARALLEL)(test_kernels.die_on_shape)
            s.compute.configure_kernel("t_die", marker=str(tmp_path / "died"))
            s.models.add(_model(), model_id="m")
            report = s.compute.apply("t_die")
            assert report.ok and (tmp_path / "died").exists()
            rows = s.results.export_metrics("t_die")["m"]
            assert rows["victim"]["t_die"] == 49.0 and len(rows) == 7
            s.compute.kernel(name="t_sq", execution_protocol=PARALLEL)(test_kernels.squared_sum)
            assert s.compute.apply("t_sq").ok

    def test_a_unit_that_always_kills_its_worker_fails_alone(self):
        """A unit that kills every worker it runs on fails with the reason; every other
        unit of its chunk is stored."""
        with Session(config=_pool()) as s:
            s.compute.kernel(name="t_die", execution_protocol=PARALLEL)(test_kernels.die_on_shape)
            s.models.add(_model(), model_id="m")
            with pytest.raises(ApplyError, match=r"(?s)1 unit\(s\) failed.*t_die on m/victim: its "
                               r"worker process died while running it, twice"):
                s.compute.apply("t_die")
            assert len(s.results.export_metrics("t_die")["m"]) == 6


class TestHungWorkers:
    def test_a_unit_over_the_timeout_fails_and_its_worker_is_stopped(self):
        """unit_timeout fails a stuck unit and replaces the pool; the others are stored
        and leaving the session does not wait for the stuck worker."""
        start = time.monotonic()
        with Session(config=_pool(unit_timeout=2.0)) as s:
            s.compute.kernel(name="t_hang", execution_protocol=PARALLEL)(test_kernels.hang_on_shape)
            s.models.add(_model(), model_id="m")
            with pytest.raises(ApplyError, match=r"t_hang on m/victim: timed out: still running "
                               r"after 2 s \(unit_timeout\); its worker was stopped"):
                s.compute.apply("t_hang")
            assert len(s.results.export_metrics("t_hang")["m"]) == 6
            with pytest.raises(ApplyError, match=r"still running after 1.5 s \(unit_timeout\)"):
                s.compute.apply("t_hang", unit_timeout=1.5)  # per call
        assert time.monotonic() - start < 40  # not the 60 s the stuck unit sleeps


class TestGroupedTasks:
    """Units much shorter than a task's cost in the executor are sent several per task
    (GROUP_SECONDS); results, failures and timeouts stay per unit."""

    def test_short_units_share_tasks_and_keep_their_results(self, monkeypatch):
        from diffract.core.compute import runner

        tasks = []
        original = runner.invoke_group
        monkeypatch.setattr(runner, "invoke_group",
                            lambda calls: tasks.append(len(calls)) or original(calls))
        model = {f"p{i}": np.full((3, 3), float(i)) for i in range(60)}
        with Session(config={"parallel": {"executor": "threads", "pool_min_seconds": 0}},
                     executor_options={"max_workers": 2}) as s:
            s.compute.kernel(name="t_sq", execution_protocol=PARALLEL)(test_kernels.squared_sum)
            s.models.add(model, model_id="m")
            s.compute.apply("t_sq")
            got = s.results.export_metrics("t_sq")["m"]
        assert {p: v["t_sq"] for p, v in got.items()} == {
            f"p{i}": 9.0 * i * i for i in range(60)}
        assert tasks and max(tasks) > 1  # grouped, after the first chunk measured them
        assert sum(tasks) <= 60

    def test_a_stuck_unit_in_a_group_fails_alone(self):
        model = {f"p{i:02d}": np.full((3, 3), float(i)) for i in range(20)}
        model["victim"] = np.ones((7, 7))  # mid-model: in a chunk sent in groups
        model.update({f"p{i:02d}": np.full((3, 3), float(i)) for i in range(20, 40)})
        with Session(config=_pool(unit_timeout=1.0)) as s:
            s.compute.kernel(name="t_hang", execution_protocol=PARALLEL)(test_kernels.hang_on_shape)
            s.models.add(model, model_id="m")
            with pytest.raises(ApplyError, match=r"t_hang on m/victim: timed out") as err:
                s.compute.apply("t_hang")
            assert len(err.value.report.failures) == 1
            assert len(s.results.export_metrics("t_hang")["m"]) == 40

    def test_a_unit_timeout_does_not_count_the_workers_start_up(self, monkeypatch):
        """Workers that take 3 s to import the kernel's module (a busy machine) and a 1 s
        unit_timeout: only the stuck unit fails (17 of 41 timed out under load before)."""
        import os

        from tests.resources import slow_start_kernels

        monkeypatch.setenv("DIFFRACT_TEST_SLOW_IMPORT", "3")
        monkeypatch.setenv("DIFFRACT_TEST_PARENT", str(os.getpid()))
        model = {f"p{i:02d}": np.full((3, 3), float(i)) for i in range(20)}
        model["victim"] = np.ones((7, 7))
        with Session(config=_pool(unit_timeout=1.0)) as s:
            s.compute.kernel(name="t_slow_hang", execution_protocol=PARALLEL)(
                slow_start_kernels.slow_hang)
            s.models.add(model, model_id="m")
            with pytest.raises(ApplyError, match=r"t_slow_hang on m/victim: timed out") as err:
                s.compute.apply("t_slow_hang")
            assert len(err.value.report.failures) == 1
            assert len(s.results.export_metrics("t_slow_hang")["m"]) == 20


INTERRUPTED = textwrap.dedent("""
    import sys
    import numpy as np
    from diffract import KernelExecutionProtocol, Session
    from tests.resources.kernels import tick

    if __name__ == "__main__":
        log = sys.argv[1]
        config = {"parallel": {"executor": "processes", "pool_min_seconds": 0,
                               "process_pool": {"max_workers": 2}},
                  "apply": {"chunk_seconds": 100}}
        with Session(config=config) as s:
            s.compute.kernel(name="t_tick", execution_protocol=KernelExecutionProtocol.PARALLEL)(tick)
            s.compute.configure_kernel("t_tick", log=log)
            s.models.add({f"p{i}": np.ones((2, 2)) for i in range(40)}, model_id="m")
            print("ready", flush=True)
            try:
                s.compute.apply("t_tick")
            except KeyboardInterrupt:
                print("stored", len(s.results.export_metrics("t_tick")["m"]), flush=True)
""")


class TestInterrupt:
    def test_ctrl_c_cancels_queued_units_and_keeps_committed_chunks(self, tmp_path):
        """SIGINT during 40 queued one-second units: the process exits without running
        the queue (a handful of units ran, not 40) and reports what was stored."""
        script = tmp_path / "interrupted.py"
        script.write_text(INTERRUPTED)
        log = tmp_path / "ticks"
        child = subprocess.Popen([sys.executable, str(script), str(log)], cwd=ROOT,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text().count("x") >= 4):  # chunks are running
            assert time.monotonic() < deadline, child.stderr.read()
            time.sleep(0.1)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
        ran = log.read_text().count("x")
        assert ran < 20, f"{ran} units ran after Ctrl-C: the queue was not cancelled"
        assert out.strip().splitlines()[-1].startswith("stored "), err


HELD_POOL = textwrap.dedent("""
    import multiprocessing, sys
    import numpy as np
    from diffract import KernelExecutionProtocol, Session
    from tests.resources.kernels import squared_sum

    if __name__ == "__main__":
        config = {"parallel": {"executor": "processes", "pool_min_seconds": 0,
                               "process_pool": {"max_workers": 2}}}
        try:
            with Session(config=config) as s:
                s.compute.kernel(name="t_sq",
                                 execution_protocol=KernelExecutionProtocol.PARALLEL)(squared_sum)
                s.models.add({f"p{i}": np.ones((3, 3)) for i in range(8)}, model_id="m")
                s.compute.apply("t_sq")  # the workers are up and idle now
                print("ready", len(multiprocessing.active_children()), flush=True)
                sys.stdin.readline()  # a notebook's session, held until the kernel stops
        except KeyboardInterrupt:
            print("stopped", flush=True)
""")


class TestQuietWorkers:
    def test_ctrl_c_to_the_process_group_prints_no_worker_traceback(self, tmp_path):
        """SIGINT to the whole group (a Jupyter kernel shutting down): the idle pool workers
        print no KeyboardInterrupt traceback; the session stops them."""
        script = tmp_path / "held.py"
        script.write_text(HELD_POOL)
        child = subprocess.Popen([sys.executable, str(script)], cwd=ROOT,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)},
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert child.stdout.readline().split() == ["ready", "2"]  # two idle workers
        os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=120)
        assert out.strip() == "stopped", err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


#: Ctrl-C lands the moment a worker process has been started, before the parent has
#: handed it its start-up data (a real Ctrl-C during start-up can land there).
SPAWN_INTERRUPTED = textwrap.dedent("""
    import os, signal, sys
    from multiprocessing import util
    import numpy as np
    from diffract import KernelExecutionProtocol, Session
    from tests.resources.kernels import squared_sum

    if __name__ == "__main__":
        started = util.spawnv_passfds

        def start_then_interrupt(path, args, passfds):
            pid = started(path, args, passfds)
            if "--multiprocessing-fork" in args:  # a worker (not the resource tracker)
                os.killpg(0, signal.SIGINT) if sys.argv[1] == "group" else signal.raise_signal(
                    signal.SIGINT)
            return pid

        util.spawnv_passfds = start_then_interrupt
        config = {"parallel": {"executor": "processes", "pool_min_seconds": 0,
                               "process_pool": {"max_workers": 2}}}
        try:
            with Session(config=config) as s:
                s.compute.kernel(name="t_sq",
                                 execution_protocol=KernelExecutionProtocol.PARALLEL)(squared_sum)
                s.models.add({f"p{i}": np.ones((3, 3)) for i in range(8)}, model_id="m")
                s.compute.apply("t_sq")
            print("not interrupted", flush=True)
        except KeyboardInterrupt:
            print("stopped", flush=True)
""")


class TestInterruptedStart:
    @pytest.mark.parametrize("to", ["session", "group"])
    def test_ctrl_c_while_a_worker_starts_leaves_it_no_traceback(self, tmp_path, to):
        """Found by CI: Ctrl-C between a worker's start and the hand-over of its start-up
        data made the worker read an empty pipe and print multiprocessing's EOFError
        traceback. The interrupt waits for the hand-over, then stops the apply as ever.
        Sent to the whole group (a terminal's Ctrl-C), it also reaches the worker while
        its Python starts, before it can ignore it: no KeyboardInterrupt traceback there
        either. stderr is read to its end: every worker has exited."""
        script = tmp_path / "spawn_interrupted.py"
        script.write_text(SPAWN_INTERRUPTED)
        run = subprocess.run([sys.executable, str(script), to], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)},
                             capture_output=True, text=True, timeout=180,
                             start_new_session=True)
        assert run.stdout.strip() == "stopped", run.stderr
        assert "Traceback" not in run.stderr, run.stderr


UNGUARDED = textwrap.dedent("""
    import os

    import numpy as np
    from diffract import KernelExecutionProtocol, Session
    from tests.resources.kernels import squared_sum, worker_pid

    with open(os.environ["SIDE_EFFECT"], "a") as fh:
        fh.write("ran\\n")  # the script's top level: must run exactly once
    config = {"parallel": {"executor": "processes", "pool_min_seconds": 0,
                           "process_pool": {"max_workers": 2}}}
    with Session(config=config) as s:
        for name, fn in (("t_sq", squared_sum), ("t_pid", worker_pid)):
            s.compute.kernel(name=name, execution_protocol=KernelExecutionProtocol.PARALLEL)(fn)
        s.models.add({f"p{i}": np.full((3, 3), float(i)) for i in range(8)}, model_id="m")
        s.compute.apply("t_sq", "t_pid")
        rows = s.results.export_metrics("t_sq", "t_pid")["m"]
    print("values", [rows[f"p{i}"]["t_sq"] for i in range(8)])
    print("in workers", any(r["t_pid"] != os.getpid() for r in rows.values()))
""")

MAIN_KERNEL = textwrap.dedent("""
    import os

    import numpy as np
    from diffract import KernelExecutionProtocol, Session

    def t_local(weights):
        return float(weights.sum())

    config = {"parallel": {"executor": "processes", "pool_min_seconds": 0}}
    with Session(config=config) as s:
        s.compute.kernel(execution_protocol=KernelExecutionProtocol.PARALLEL)(t_local)
        s.models.add({"w": np.ones((2, 2))}, model_id="m")
        s.compute.apply("t_local")
        print("values", s.results.export_metrics("t_local")["m"]["w"]["t_local"])
""")

#: What the sequential executor stores for UNGUARDED's model.
EXPECTED = f"values {[9.0 * i * i for i in range(8)]}"


class TestSpawnSafety:
    """A program that cannot use spawned workers (no guard, standard input, a kernel in
    a main program without a file) gets the same values in this process, said once."""

    def _run(self, *args, stdin=None, cwd=ROOT, side=None):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SIDE_EFFECT": str(side or os.devnull)}
        return subprocess.run([sys.executable, *args], input=stdin, capture_output=True,
                              text=True, cwd=cwd, env=env, timeout=180)

    @pytest.mark.parametrize("how", ["script", "stdin", "-c"])
    def test_a_program_without_a_guard_runs_once_with_the_pools_values(self, tmp_path, how):
        """A guard-less script, the same code on standard input or with -c, the pool
        forced: exit 0, the sequential executor's values, the top level ran once."""
        side = tmp_path / "side.txt"
        script = tmp_path / "unguarded.py"
        script.write_text(UNGUARDED)
        args = {"script": [str(script)], "stdin": ["-"], "-c": ["-c", UNGUARDED]}[how]
        run = self._run(*args, stdin=UNGUARDED if how == "stdin" else None, side=side)
        assert run.returncode == 0, run.stderr
        assert EXPECTED in run.stdout
        assert side.read_text() == "ran\n"
        told = [line for line in run.stderr.splitlines() if "ExecutorWarning" in line]
        if how == "-c":  # no file to re-run: the pool is used, nothing to tell
            assert "in workers True" in run.stdout and told == []
        else:
            assert "in workers False" in run.stdout and len(told) == 1, run.stderr
            assert "PARALLEL kernels run in this process" in told[0]
            assert ("has no 'if __name__ == \"__main__\":' guard" if how == "script"
                    else "read from standard input") in told[0]
            # said at the user's apply() line, not at a line of Diffract's own
            line = 1 + UNGUARDED.splitlines().index('    s.compute.apply("t_sq", "t_pid")')
            where = str(script) if how == "script" else "<stdin>"
            assert told[0].startswith(f"{where}:{line}: ExecutorWarning"), run.stderr
            assert "runner.py" not in run.stderr and "in_process" not in run.stderr

    @pytest.mark.parametrize("start_up, told", [("1e-12", 1), (None, 0)])
    def test_it_is_said_only_when_the_pool_would_have_paid(self, tmp_path, start_up, told):
        """Left to decide, the runner says the guard is missing when the pool would have
        paid for its start-up (a tiny one here), and says nothing when this small model
        needs no pool (the default): the same values either way."""
        side = tmp_path / "side.txt"
        script = tmp_path / "unguarded.py"
        setting = f'"pool_min_seconds": {start_up}, ' if start_up else ""
        script.write_text(re.sub(r'"pool_min_seconds": 0,\s*', setting, UNGUARDED))
        run = self._run(str(script), side=side)
        assert run.returncode == 0, run.stderr
        assert EXPECTED in run.stdout and "in workers False" in run.stdout
        warned = [line for line in run.stderr.splitlines() if "ExecutorWarning" in line]
        assert len(warned) == told, run.stderr
        assert all("has no 'if __name__ == \"__main__\":' guard" in w for w in warned)

    def test_a_guarded_script_keeps_the_pool(self, tmp_path):
        """With the guard, the work goes to the worker processes, the top level runs once."""
        side = tmp_path / "side.txt"
        body = UNGUARDED.split("with open(", 1)
        guarded = tmp_path / "guarded.py"
        guarded.write_text(body[0] + "if __name__ == '__main__':\n" + textwrap.indent(
            "with open(" + body[1], "    "))
        run = self._run(str(guarded), side=side)
        assert run.returncode == 0, run.stderr
        assert EXPECTED in run.stdout and "in workers True" in run.stdout
        assert side.read_text() == "ran\n" and "ExecutorWarning" not in run.stderr

    @pytest.mark.parametrize("how", ["stdin", "-c"])
    def test_a_kernel_of_a_main_program_without_a_file_runs_here(self, how):
        """A PARALLEL kernel defined in code read from stdin or given with -c cannot reach
        workers: it runs here, with its value, and the reason is said once."""
        args = ["-"] if how == "stdin" else ["-c", MAIN_KERNEL]
        run = self._run(*args, stdin=MAIN_KERNEL if how == "stdin" else None)
        assert run.returncode == 0, run.stderr
        assert "values 4.0" in run.stdout
        assert run.stderr.count("ExecutorWarning") == 1, run.stderr
        assert ("read from standard input" if how == "stdin"
                else "kernel 't_local' is defined in a main program with no file") in run.stderr


class TestOptions:
    @pytest.mark.parametrize(("options", "message"), [
        ({"max_workers": -1}, r"max_workers must be an integer >= 1, got -1"),
        ({"start_method": "bogus"}, r"start_method 'bogus' is not available here"),
        ({"workers": 2}, r"unknown option\(s\) \['workers'\]"),
    ])
    def test_bad_executor_options_are_refused_when_the_session_opens(self, options, message):
        """Options are checked by Session(), not by the first PARALLEL kernel."""
        with pytest.raises(ExecutorError, match=message):
            Session(executor="processes", executor_options=options)

    def test_executor_by_name_in_the_configuration_or_the_session(self):
        """[executor] name and Session(executor=) choose it; an unknown name is refused."""
        with Session(config={"executor": {"name": "threads"}}) as s:
            assert s._executors.name == "threads"
        with Session(executor="sequential") as s:
            assert s._executors.name == "sequential"
        with pytest.raises(UnknownExecutorError, match=r"Unknown executor 'dsak'"):
            Session(executor="dsak")

    def test_each_worker_gets_its_share_of_the_cores(self):
        """Worker processes limit BLAS/OpenMP threads to cores // workers (at least 1)."""
        cpus = len(os.sched_getaffinity(0))
        with Session(config=_pool()) as s:
            s.compute.kernel(name="t_threads", execution_protocol=PARALLEL)(test_kernels.worker_threads)
            s.models.add({"w": np.ones((2, 2)), "v": np.ones((2, 3))}, model_id="m")
            s.compute.apply("t_threads")
            values = {r["t_threads"] for r in s.results.export_metrics("t_threads")["m"].values()}
        assert values == {max(1, cpus // 2)}


class TestPoolOnlyWhenWorthIt:
    def test_small_parallel_work_runs_in_process(self):
        """With the default pool_min_seconds, a quick PARALLEL step never starts a pool."""
        with Session(executor="processes") as s:
            s.compute.kernel(name="t_pid", execution_protocol=PARALLEL)(test_kernels.worker_pid)
            s.models.add(_model(), model_id="m")
            s.compute.apply("t_pid")
            pids = {r["t_pid"] for r in s.results.export_metrics("t_pid")["m"].values()}
            assert pids == {os.getpid()}

    def test_the_pool_is_worth_what_it_saves_over_its_start_up(self):
        """A pool of W workers saves ``left * (1 - cores / W)`` seconds over this process
        when the work kept ``cores`` busy here (a batch path runs a solver per core): it
        starts only when that exceeds its start-up."""
        from diffract.core.compute.runner import pool_pays

        assert pool_pays(10.0, 1.0, 2, 2.0)  # one core busy here: saves 5 s
        assert not pool_pays(10.0, 2.0, 2, 2.0)  # both busy already: saves nothing
        assert not pool_pays(10.0, 1.7, 2, 2.0)  # saves 1.5 s, less than the start-up
        assert not pool_pays(3.0, 1.0, 2, 2.0)
        assert not pool_pays(100.0, 1.0, 1, 2.0)  # one worker is this process again
        assert pool_pays(6.0, 0.0, 4, 2.0)  # idle work counts as one core: saves 4.5 s
        assert not pool_pays(6.0, 9.0, 4, 2.0)

    def test_work_left_is_estimated_by_its_bytes_not_its_unit_count(self):
        """Four large units first, then many tiny ones: the work left is tiny, so no pool
        starts (timed per unit, the large units' time made the rest look like 14 s)."""
        model = {f"big{i}": np.zeros((2000, 2000), dtype=np.float32) for i in range(4)}
        model.update({f"small{i}": np.zeros((10, 10)) for i in range(36)})
        with Session(config={"parallel": {"executor": "processes",
                                          "process_pool": {"max_workers": 2}}}) as s:
            s.compute.kernel(name="t_idle", execution_protocol=PARALLEL)(test_kernels.idle_pid)
            s.models.add(model, model_id="m")
            s.compute.apply("t_idle")
            pids = {r["t_idle"] for r in s.results.export_metrics("t_idle")["m"].values()}
        assert pids == {os.getpid()}

    def test_enough_work_that_keeps_one_core_busy_goes_to_the_pool(self):
        """Equal units whose rest, timed here, is worth more than the pool's start-up
        (36 units of 0.2 s idle: 3.6 s saved by two workers) run on the workers."""
        model = {f"p{i}": np.zeros((100, 100)) for i in range(40)}
        with Session(config={"parallel": {"executor": "processes",
                                          "process_pool": {"max_workers": 2}}}) as s:
            s.compute.kernel(name="t_idle", execution_protocol=PARALLEL)(test_kernels.idle_pid)
            s.compute.configure_kernel("t_idle", per_element=2e-5)
            s.models.add(model, model_id="m")
            s.compute.apply("t_idle")
            pids = {r["t_idle"] for r in s.results.export_metrics("t_idle")["m"].values()}
        assert os.getpid() in pids and len(pids - {os.getpid()}) >= 1

    def test_a_kernel_that_overlaps_its_batches_here_keeps_off_local_workers(self):
        """The same work from a kernel whose batch overlaps chunks in this process (one
        solver per core: overlap_batches) stays here: local workers share these cores.
        On a 1B-shaped checkpoint the esd step went to the pool (a two-unit chunk, timed
        alone, kept 1.7 of 2 cores busy) and took 5 s longer than in process."""
        model = {f"p{i}": np.zeros((100, 100)) for i in range(40)}
        with Session(config={"parallel": {"executor": "processes",
                                          "process_pool": {"max_workers": 2}}}) as s:
            s.compute.kernel(name="t_idle", execution_protocol=PARALLEL,
                             overlap_batches=True)(test_kernels.idle_pid)
            s.compute.configure_kernel("t_idle", per_element=2e-5)
            s.models.add(model, model_id="m")
            s.compute.apply("t_idle")
            pids = {r["t_idle"] for r in s.results.export_metrics("t_idle")["m"].values()}
        assert pids == {os.getpid()}

    def test_progress_events_count_failures_and_rate(self):
        """Each progress event carries failed units and a positive rate."""
        events = []
        with Session(config={"cache": {"max_bytes": 64}}) as s:
            s.compute.kernel(name="t_fail")(test_kernels.fails_on_bias)
            s.models.add({"w": np.ones((2, 2)), "b": np.ones(3)}, model_id="m")
            s.compute.apply("t_fail", errors="record", progress=events.append)
        assert events[-1].done == 2 and events[-1].failed == 1 and events[-1].rate > 0


class TestWorkersReadFiles:
    def test_workers_read_file_backed_weights_themselves(self, tmp_path, monkeypatch):
        """A model from a file sends workers a reference, not the data: the session's
        process never reads the weights, and the values are those of the file."""
        arrays = {f"p{i}": np.full((4, 3), float(i)) for i in range(5)}
        path = tmp_path / "m.npz"
        np.savez(path, **arrays)
        with Session(config=_pool()) as s:
            s.compute.kernel(name="t_sq", execution_protocol=PARALLEL)(test_kernels.squared_sum)
            s.models.add(path, model_id="m")

            def not_here(model_id, param):
                raise AssertionError("the session's process read the weights")

            monkeypatch.setattr(s.store, "load_weights", not_here)
            s.compute.apply("t_sq")
            rows = s.results.export_metrics("t_sq")["m"]
        assert rows == {f"p{i}": {"t_sq": 12.0 * i * i} for i in range(5)}

    def test_a_file_changed_under_the_workers_fails_its_units(self, tmp_path):
        """Workers check the file's identity too: a replaced file fails each unit with
        what changed."""
        path = tmp_path / "m.npz"
        np.savez(path, a=np.ones((3, 3)), b=np.ones((2, 2)))
        with Session(config=_pool()) as s:
            s.compute.kernel(name="t_sq", execution_protocol=PARALLEL)(test_kernels.squared_sum)
            s.models.add(path, model_id="m")
            np.savez(path, a=np.ones((5, 5)), b=np.ones((2, 2)), c=np.ones(1))
            with pytest.raises(ApplyError, match=r"(?s)cannot read input 'weights' of m/a: "
                               r"ModelSourceError: .*changed since the model was added"):
                s.compute.apply("t_sq")


def _children(pid: int) -> set[int]:
    """Live processes whose parent is ``pid`` (from /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for child in _children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("sig, executor", [(signal.SIGKILL, "processes"),
                                           (signal.SIGTERM, "processes"),
                                           (signal.SIGKILL, "dask")])
def test_pool_workers_exit_when_the_session_process_is_killed(tmp_path, sig, executor):
    """SIGKILL or SIGTERM of a process whose apply runs on the pool (or a Dask
    LocalCluster's nannies and workers): every process it started exits within seconds
    (the pool's workers were alive 400 s later, holding the parent's stdout open)."""
    if executor == "dask":
        pytest.importorskip("diffract_executor_dask")
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import numpy as np
        from diffract import KernelExecutionProtocol, Session
        from tests.resources import kernels

        if __name__ == "__main__":
            config = {{"parallel": {{"executor": {executor!r}, "pool_min_seconds": 0}}}}
            with Session(config=config) as s:
                s.compute.kernel(name="t_tick", execution_protocol=KernelExecutionProtocol.PARALLEL)(
                    kernels.tick)
                s.compute.configure_kernel("t_tick", log={str(tmp_path / "log")!r}, seconds=60)
                s.models.add({{f"p{{i}}": np.ones((3, 3)) for i in range(8)}}, "m")
                s.compute.apply("t_tick")
    """))
    env = {k: v for k, v in os.environ.items() if k != "DIFFRACT_STRICT_PLUGINS"}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "log").exists():
        time.sleep(0.1)
    assert (tmp_path / "log").exists(), "no unit started on the pool"
    workers = _descendants(proc.pid)
    assert workers, "the pool's workers were not found"
    proc.send_signal(sig)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.2)
    left = [w for w in workers if _alive(w)]
    for w in left:  # do not leave them behind if the test fails
        with contextlib.suppress(OSError):
            os.kill(w, signal.SIGKILL)
    assert left == []


def test_the_sessions_threads_keep_openmp_to_one_thread_and_the_caller_keeps_its_own():
    """The I/O pool's and the ``threads`` executor's threads open OpenMP regions on one
    thread (a team per thread made GNU OpenMP stop spin-waiting for the caller's team:
    a training loop beside a monitor ran every step 1.3-2x slower), even after the user
    gave torch a count; the caller's count is untouched."""
    torch = pytest.importorskip("torch")
    from diffract.core.executors import thread_executor

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with Session() as s:
            kernels = thread_executor(s.config, {"max_workers": 2})
            got = [pool.submit(torch.get_num_threads).result()
                   for pool in (s._thread_pool(), kernels)]
            kernels.shutdown()
        assert got == [1, 1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
