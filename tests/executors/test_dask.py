"""The dask executor: same results as sequential, a lost worker's tasks rescheduled,
options checked when the session opens (on a 2-worker LocalCluster)."""

from __future__ import annotations

import numpy as np
import pytest

from diffract import KernelExecutionProtocol, Session
from diffract.errors import ExecutorError
from tests.resources import executors
from tests.resources import kernels as test_kernels

distributed = pytest.importorskip("distributed")
pytest.importorskip("diffract_executor_dask")

PARALLEL = KernelExecutionProtocol.PARALLEL


@pytest.fixture(scope="module")
def cluster():
    """One 2-worker LocalCluster for the module (sessions connect by address)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None, silence_logs=40) as c:
        yield c


_model, _run = executors.model, executors.run


class TestDask:
    def test_same_results_as_sequential_on_a_cluster_by_address(self, cluster, rng):
        """Units run on the cluster's workers and give the sequential executor's values."""
        model = _model(rng)
        _, local = _run({"executor": "sequential"}, model, test_kernels.squared_sum, "t_sq")
        report, remote = _run({"executor": "dask",
                               "executor_options": {"address": cluster.scheduler_address}},
                              model, test_kernels.squared_sum, "t_sq")
        assert report.ok and remote == local
        _, pids = _run({"executor": "dask",
                        "executor_options": {"address": cluster.scheduler_address}},
                       model, test_kernels.worker_pid, "t_pid")
        import os

        assert os.getpid() not in set(pids.values()) and len(set(pids.values())) >= 1

    def test_a_lost_worker_has_its_task_rescheduled(self, cluster, rng, tmp_path):
        """A worker killed while running a unit: Dask reruns it elsewhere; nothing fails
        and every value is stored."""
        model = _model(rng)
        report, rows = _run({"executor": "dask",
                             "executor_options": {"address": cluster.scheduler_address}},
                            model, test_kernels.die_on_shape, "t_die",
                            marker=str(tmp_path / "died"))
        assert report.ok and (tmp_path / "died").exists()
        assert rows["victim"] == 49.0 and len(rows) == len(model)

    def test_a_local_cluster_when_no_address_is_given(self, rng):
        """Without an address the executor starts (and stops) its own LocalCluster."""
        report, rows = _run({"executor": "dask", "executor_options": {"n_workers": 2}},
                            {"w": np.ones((3, 3)), "v": np.ones((2, 5))},
                            test_kernels.squared_sum, "t_sq")
        assert report.ok and rows == {"w": 9.0, "v": 10.0}

    def test_a_chosen_executor_that_ran_nothing_says_so_once(self, rng, monkeypatch):
        """A model too small for workers to pay: the chosen executor is never started,
        and one warning says that the work ran in this process and how to send it
        there; the core's own executors say nothing."""
        import warnings

        from diffract.core.compute import runner
        from diffract.errors import ExecutorWarning

        monkeypatch.setattr(runner, "_TOLD", set())
        for executor in ("dask", "processes"):
            with warnings.catch_warnings(record=True) as caught, Session(
                    executor=executor) as s:
                warnings.simplefilter("always")
                s.models.add({"w": rng.standard_normal((60, 40))}, "m")
                s.compute.apply("stable_rank")
                s.compute.apply("pl_alpha")
                assert s._executors._executor is None  # never built
            said = [str(w.message) for w in caught if issubclass(w.category,
                                                                 ExecutorWarning)]
            if executor == "dask":
                assert said == [
                    "the 'dask' executor ran none of this step: its work was too small for "
                    "workers to save their start-up (parallel.pool_min_seconds = 2 s), so "
                    "it ran in this process, with the same values; "
                    "parallel.pool_min_seconds = 0 sends every PARALLEL step to the "
                    "executor."]
            else:
                assert said == []

    @pytest.mark.parametrize(("options", "message"), [
        ({"address": 8786}, r"address must be a scheduler address string, got 8786"),
        ({"n_workers": 0}, r"n_workers must be an integer >= 1, got 0"),
        ({"scheduler": "x"}, r"unknown option\(s\) \['scheduler'\]"),
    ])
    def test_bad_options_are_refused_when_the_session_opens(self, options, message):
        """Options are checked by Session(), before any cluster is contacted."""
        with pytest.raises(ExecutorError, match=message):
            Session(executor="dask", executor_options=options)


def _worker_settings():
    import os

    from threadpoolctl import threadpool_info

    return (os.environ.get("MALLOC_TRIM_THRESHOLD_"),
            max((p["num_threads"] for p in threadpool_info()), default=1))


class TestWorkerSettings:
    def test_each_worker_gets_its_share_of_the_cores(self, cluster):
        """A cluster given by address: every worker limited to cores // threads on its
        host (here 2 single-threaded workers on one host)."""
        import os

        from diffract_executor_dask import share_cores

        with distributed.Client(cluster.scheduler_address) as client:
            shares = share_cores(client)
            settings = client.run(_worker_settings)
        expected = max(1, len(os.sched_getaffinity(0)) // 2)
        assert set(shares.values()) == {expected} and len(shares) == 2
        assert {threads for _, threads in settings.values()} == {expected}

    def test_our_local_cluster_leaves_out_the_malloc_trim_setting(self):
        import os

        import dask
        from diffract_executor_dask import local_cluster_config, start_local_cluster

        config = local_cluster_config()
        assert "MALLOC_TRIM_THRESHOLD_" in dask.config.get("distributed.nanny.pre-spawn-environ")
        assert "MALLOC_TRIM_THRESHOLD_" not in config["distributed.nanny.pre-spawn-environ"]
        assert config["distributed.nanny.pre-spawn-environ"]["OMP_NUM_THREADS"] == 1
        before = os.environ.get("MALLOC_TRIM_THRESHOLD_")  # an earlier cluster may set it
        with start_local_cluster(1) as c, distributed.Client(c) as client:
            ((trim, _),) = client.run(_worker_settings).values()
        assert trim is None and os.environ.get("MALLOC_TRIM_THRESHOLD_") == before


def test_what_the_workers_read_themselves():
    """A LocalCluster reads every checkpoint itself; a cluster by address those in
    object storage ("urls"), this machine's files only with read_files=true;
    read_files=false ships everything (tests/sources/test_objects.py runs both)."""
    from diffract_executor_dask.executor import reads_files

    assert reads_files({}) is True
    assert reads_files({"address": "tcp://head:8786"}) == "urls"
    assert reads_files({"address": "tcp://head:8786", "read_files": True}) is True
    assert reads_files({"read_files": False}) is False
