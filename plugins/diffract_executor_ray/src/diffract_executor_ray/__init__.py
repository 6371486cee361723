"""Diffract's ``ray`` executor (see :mod:`diffract_executor_ray.executor`)."""

from diffract_executor_ray.executor import RayExecutor, check_options

__version__ = "0.2.0"

__all__ = ["RayExecutor", "__version__", "check_options"]
