"""Diffract's ``dask`` executor (see :mod:`diffract_executor_dask.executor`)."""

from diffract_executor_dask.executor import (
    DaskExecutor,
    check_options,
    local_cluster_config,
    share_cores,
    start_local_cluster,
)

__version__ = "0.2.0"

__all__ = ["DaskExecutor", "__version__", "check_options", "local_cluster_config",
           "share_cores", "start_local_cluster"]
