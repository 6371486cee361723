"""Diffract's ``dask`` executor (see :mod:`diffract_executor_dask.executor`)."""

from diffract_executor_dask.executor import DaskExecutor, check_options

__version__ = "0.1.0"

__all__ = ["DaskExecutor", "__version__", "check_options"]
