"""The ray executor, on a local Ray of two CPUs started by the tests: the sequential
executor's values, a worker killed mid-unit has its task run again, a unit that raises
fails alone, an interrupted run resumes from the ``local`` store, options are checked
when the session opens, and a session with no cluster connected starts its own (no
dashboard, no usage report) and stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from diffract import KernelExecutionProtocol, Session
from diffract.errors import ExecutorError
from tests.resources import executors
from tests.resources import kernels as test_kernels

ray = pytest.importorskip("ray")
pytest.importorskip("diffract_executor_ray")

PARALLEL = KernelExecutionProtocol.PARALLEL
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster():
    """One local Ray of 2 CPUs for the module: the sessions find it connected."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}}, logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()


_model, _run = executors.model, executors.run


class TestRay:
    def test_the_sequential_executors_values_from_rays_workers(self, cluster, rng):
        model = _model(rng)
        _, local = _run({"executor": "sequential"}, model, test_kernels.squared_sum, "t_sq")
        report, remote = _run({"executor": "ray"}, model, test_kernels.squared_sum, "t_sq")
        assert report.ok and remote == local
        _, pids = _run({"executor": "ray"}, model, test_kernels.worker_pid, "t_pid")
        assert os.getpid() not in set(pids.values()) and len(pids) == len(model)
        assert ray.is_initialized()  # a cluster the session found is left running

    def test_a_worker_killed_mid_unit_has_its_task_run_again(self, cluster, rng, tmp_path):
        model = _model(rng)
        report, rows = _run({"executor": "ray"}, model, test_kernels.die_on_shape, "t_die",
                            marker=str(tmp_path / "died"))
        assert report.ok and (tmp_path / "died").exists()
        assert rows["victim"] == 49.0 and len(rows) == len(model)

    def test_a_unit_that_raises_fails_alone(self, cluster, rng):
        model = {**_model(rng, 4), "bias": np.ones(5)}
        with Session(executor="ray", config={"parallel": {"pool_min_seconds": 0}}) as s:
            s.compute.kernel(name="t_fail", execution_protocol=PARALLEL)(
                test_kernels.fails_on_bias)
            s.models.add(model, model_id="m")
            report = s.compute.apply("t_fail", errors="record")
            rows = s.results.export_metrics("t_fail")["m"]
        assert [f.param for f in report.failures] == ["bias"]
        assert "cannot handle a vector of length 5" in report.failures[0].reason
        assert rows["p2"]["t_fail"] == float(np.abs(model["p2"]).max())

    @pytest.mark.parametrize(("options", "message"), [
        ({"address": 6379}, r"address must be a Ray address string"),
        ({"address": "127.0.0.1:\u0666\u0663\u0667\u0669"}, r"is not host:port.*ASCII"),
        ({"address": "127.0.0.1:70000"}, r"a port from 1 to 65535"),
        ({"runtime_env": {"env_vars": {"A": 1}}}, r"env_vars must be a table of names to "
                                                  r"strings"),
        ({"runtime_env": {"env_vars": "A=1"}}, r"env_vars must be a table"),
        ({"runtime_env": {"pip": 3}}, r"runtime_env.pip must be a string, a list or a table"),
        ({"num_cpus": 0}, r"num_cpus must be an integer >= 1, got 0"),
        ({"max_retries": -1}, r"max_retries must be an integer >= 0, got -1"),
        ({"scheduler": "x"}, r"unknown option\(s\) \['scheduler'\]"),
    ])
    def test_bad_options_are_refused_when_the_session_opens(self, options, message):
        with pytest.raises(ExecutorError, match=message):
            Session(executor="ray", executor_options=options)


OWN_CLUSTER = textwrap.dedent("""
    import os
    import numpy as np
    import ray
    from diffract import KernelExecutionProtocol, Session
    from tests.resources.kernels import worker_pid

    config = {"parallel": {"pool_min_seconds": 0}}
    with Session(executor="ray", executor_options={"num_cpus": 2}, config=config) as s:
        s.compute.kernel(name="t_pid", execution_protocol=KernelExecutionProtocol.PARALLEL)(
            worker_pid)
        s.models.add({f"p{i}": np.ones((3, 3)) for i in range(6)}, model_id="m")
        s.compute.apply("t_pid")
        pids = {r["t_pid"] for r in s.results.export_metrics("t_pid")["m"].values()}
        print("cpus", int(ray.cluster_resources()["CPU"]), flush=True)
    print("workers", os.getpid() not in pids, "running", ray.is_initialized(),
          "usage", os.environ.get("RAY_USAGE_STATS_ENABLED"), flush=True)
""")


def test_with_no_cluster_connected_it_starts_one_and_stops_it(tmp_path):
    script = tmp_path / "own.py"
    script.write_text(OWN_CLUSTER)
    env = {k: v for k, v in os.environ.items() if k != "RAY_USAGE_STATS_ENABLED"}
    run = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**env, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "cpus 2" in run.stdout
    assert "workers True running False usage 0" in run.stdout, run.stdout
    assert "dashboard" not in run.stderr.lower() and "Traceback" not in run.stderr


RESUMED = textwrap.dedent("""
    import sys
    import numpy as np
    from diffract import KernelExecutionProtocol, Session
    from tests.resources.kernels import tick

    store, log, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    config = {"parallel": {"pool_min_seconds": 0}, "apply": {"chunk_seconds": 0.01}}
    with Session("local", path=store, executor="ray", executor_options={"num_cpus": 2},
                 config=config) as s:
        s.compute.kernel(name="t_tick", execution_protocol=KernelExecutionProtocol.PARALLEL)(tick)
        s.compute.configure_kernel("t_tick", log=log, seconds=seconds)
        if "m" not in s.model_ids:
            s.models.add({f"p{i}": np.ones((2, i + 1)) for i in range(24)}, model_id="m")
        print("ready", flush=True)
        try:
            s.compute.apply("t_tick")
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise SystemExit(130)
        print("stored", len(s.results.export_metrics("t_tick")["m"]), flush=True)
""")


def test_an_interrupted_run_resumes_from_the_local_store(tmp_path):
    """Ctrl-C while the units run on Ray: the committed chunks stay in the store; the same
    script again computes only what is missing, and the values are all there."""
    script, store, log = tmp_path / "resumed.py", tmp_path / "store", tmp_path / "ticks"
    script.write_text(RESUMED)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, str(script), str(store), str(log), "0.5"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 240
    while not (log.exists() and log.read_text().count("x") >= 6):  # chunks are committing
        assert time.monotonic() < deadline and child.poll() is None, child.stderr.read()
        time.sleep(0.1)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert "interrupted" in out, err[-3000:]
    with Session("local", path=str(store)) as s:
        kept = len(s.results.export_metrics("t_tick").get("m", {}))
    assert 0 < kept < 24, kept
    first = log.read_text().count("x")
    again = subprocess.run([sys.executable, str(script), str(store), str(log), "0"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stored 24" in again.stdout
    assert log.read_text().count("x") - first == 24 - kept  # only the missing ones ran


UNREACHABLE = textwrap.dedent("""
    import sys
    import numpy as np
    from diffract import KernelExecutionProtocol, Session
    from diffract.errors import ExecutorError
    from tests.resources.kernels import squared_sum

    try:
        with Session(executor="ray", executor_options={"address": sys.argv[1]},
                     config={"parallel": {"pool_min_seconds": 0}}) as s:
            s.compute.kernel(name="t_sq", execution_protocol=KernelExecutionProtocol.PARALLEL)(
                squared_sum)
            s.models.add({"w": np.ones((3, 3))}, model_id="m")
            s.compute.apply("t_sq")
    except ExecutorError as exc:
        print("refused:", exc)
""")


@pytest.mark.parametrize(("address", "message"), [
    ("127.0.0.1:1", "no Ray cluster answers at '127.0.0.1:1' (Connection refused): start one "
                    "there (`ray start --head`)"),
    ("head-without-port", "the Ray address 'head-without-port' is not host:port"),
])
def test_an_address_where_no_cluster_answers_is_one_line_at_once(tmp_path, address, message):
    """Ray retries an unreachable address for minutes, a line every few seconds: the
    session says in one line what to fix, at once (in a fresh process: none connected)."""
    script = tmp_path / "unreachable.py"
    script.write_text(UNREACHABLE)
    run = subprocess.run([sys.executable, str(script), address], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("refused: ") and message in run.stdout, run.stdout
    assert "Failed to connect" not in run.stderr


def test_what_the_workers_read_themselves():
    """A cluster by address reads checkpoints in object storage itself ("urls"), this
    machine's files only with read_files=true; read_files=false ships everything."""
    from diffract_executor_ray.executor import reads_files

    assert reads_files({"address": "ray://head:10001"}) == "urls"
    assert reads_files({"address": "ray://head:10001", "read_files": True}) is True
    assert reads_files({"address": "ray://head:10001", "read_files": False}) is False


def test_a_listener_that_never_speaks_ray_is_given_up_naming_it(tmp_path):
    """Something accepts the connection and never answers as a Ray head would: the
    session gives up after DIFFRACT_RAY_CONNECT_TIMEOUT with one line naming the address
    (ray.init waited past 300 s)."""
    from tests.resources.silent import silent_listener

    script = tmp_path / "silent.py"
    script.write_text(UNREACHABLE)
    with silent_listener() as (address, _):
        run = subprocess.run([sys.executable, str(script), address], cwd=ROOT,
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": str(ROOT),
                                  "DIFFRACT_RAY_CONNECT_TIMEOUT": "3"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("refused: ") and f"at '{address}' did not answer within 3 s" \
        in run.stdout, run.stdout


STARTING = textwrap.dedent("""
    import numpy as np
    from diffract import KernelExecutionProtocol, Session
    from tests.resources.kernels import squared_sum

    with Session(executor="ray", executor_options={"num_cpus": 1},
                 config={"parallel": {"pool_min_seconds": 0}}) as s:
        s.compute.kernel(name="t_sq", execution_protocol=KernelExecutionProtocol.PARALLEL)(
            squared_sum)
        s.models.add({"w": np.ones((3, 3))}, model_id="m")
        s.compute.apply("t_sq")  # Ray starts here, on first use
        print("started", flush=True)
""")


def test_ctrl_c_while_a_local_ray_comes_up_leaves_no_ray_process(tmp_path):
    """SIGINT once the local Ray's first processes exist, before ray.init returns: every
    process it started (the raylet's dashboard and runtime-env agents too, which outlived
    the command) is gone when the program has ended."""
    psutil = pytest.importorskip("psutil")
    marker = f"diffract-test-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / "starting.py"
    script.write_text(STARTING)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DIFFRACT_RAY_TEST_MARK": marker}
    child = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    me = psutil.Process(child.pid)

    def marked():
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.pid != child.pid and proc.environ().get("DIFFRACT_RAY_TEST_MARK") \
                        == marker:
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    deadline = time.monotonic() + 240
    while child.poll() is None and time.monotonic() < deadline:  # the raylet is up: its
        try:  # agents are starting (their start-up is what outlived the interrupt)
            if any(p.name() == "raylet" for p in me.children(recursive=True)):
                break
        except psutil.Error:
            continue
        time.sleep(0.02)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=300)
    assert "started" not in out, "Ray came up before the interrupt: nothing was tested"
    gone, alive = psutil.wait_procs(marked(), timeout=30)
    assert not alive, [p.name() for p in alive]
