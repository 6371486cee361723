"""Session configuration: defaults, a TOML file (tomllib) or a mapping, validated.

Keys and defaults (every key is optional)::

    [parallel]
    executor = "processes"        # runs PARALLEL kernels: "processes", "threads",
                                  # "sequential", or one a plugin provides ("dask");
                                  # also spelt [executor] name = "..."
    unit_timeout = 0              # seconds a PARALLEL unit may run; 0 = no limit
    pool_min_seconds = 2.0        # a PARALLEL step goes to the executor only when it
                                  # saves more than this, its start-up (0: always)

    [parallel.thread_pool]
    max_workers = 8               # threads prefetching inputs; default min(8, CPUs)

    [parallel.process_pool]
    max_workers = 8               # workers for PARALLEL kernels; default min(8, CPUs)

    [cache]
    max_bytes = 0                 # cap on the read budget in bytes; 0 = no cap
    headroom = 0.25               # fraction of available memory left untouched

    [apply]
    chunk_seconds = 2.0           # a chunk grows to about this much work: what an
                                  # interrupt or a crash can lose at most

    [profile.<name>]              # free-form options for one storage profile
    [executor.<name>]             # free-form options for one executor

    [plugins]
    prefer = { stable_rank = "diffractml-kernels-spectral" }
                                  # which distribution provides a name two plugins
                                  # claim (process-wide, like kernel configuration)

    [kernels.<name>]              # configuration of one kernel, e.g.
    fit_method = "diffract"       # [kernels.power_law_fit]; checked against the
                                  # kernel's signature when a Session opens, and
                                  # process-wide once applied (as configure_kernel)

Pass ``Session(config=...)`` a path, a mapping, or nothing; with nothing, the file named
by the ``DIFFRACT_CONFIG`` environment variable is read when it is set."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from diffract.core.executors import cpus
from diffract.errors import ConfigError, did_you_mean

__all__ = ["Config", "load_config"]


@attrs.frozen
class Config:
    """Validated session configuration (see the module docstring for the file format)."""

    thread_workers: int = attrs.field(factory=lambda: min(8, cpus()))
    process_workers: int = attrs.field(factory=lambda: min(8, cpus()))
    executor: str = "processes"
    cache_max_bytes: int = 0
    cache_headroom: float = 0.25
    chunk_seconds: float = 2.0
    profiles: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    executors: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    unit_timeout: float = 0.0
    pool_min_seconds: float = 2.0
    prefer: Mapping[str, str] = attrs.field(factory=dict)
    kernels: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)


_SCHEMA: dict[str, Any] = {
    "parallel": {
        "executor": str,
        "unit_timeout": float,
        "pool_min_seconds": float,
        "thread_pool": {"max_workers": int},
        "process_pool": {"max_workers": int},
    },
    "cache": {"max_bytes": int, "headroom": float},
    "apply": {"chunk_seconds": float},
    "profile": dict,
    "executor": dict,
    "plugins": {"prefer": dict},
    "kernels": dict,
}


def _check(data: Mapping[str, Any], schema: Mapping[str, Any], where: str, problems: list[str]):
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in schema:
            problems.append(
                f"unknown key {path!r}.{did_you_mean(key, schema)} Known here: {sorted(schema)}"
            )
            continue
        want = schema[key]
        if isinstance(want, dict) or want is dict:
            if not isinstance(value, Mapping):
                problems.append(f"{path!r} must be a table, got {value!r}")
            elif want is not dict:
                _check(value, want, path, problems)
        elif not isinstance(value, (int, float) if want is float else want) or isinstance(
                value, bool):
            what = "a number" if want is float else want.__name__
            problems.append(f"{path!r} must be {what}, got {value!r}")


def _executor_name(data: Mapping[str, Any], default: str) -> str:
    table = data.get("executor", {})
    name = table.get("name", default) if isinstance(table, Mapping) else default
    return name if isinstance(name, str) else default


def load_config(config: str | os.PathLike[str] | Mapping[str, Any] | Config | None) -> Config:
    """Read and validate a configuration; raises :class:`ConfigError` listing every problem."""
    if isinstance(config, Config):
        return config
    source = "configuration"
    if config is None:
        env = os.environ.get("DIFFRACT_CONFIG")
        if not env:
            return Config()
        config = env
    if isinstance(config, (str, os.PathLike)):
        import tomllib  # only for a file: 3 ms of every start otherwise

        path = Path(config)
        source = str(path)
        try:
            with path.open("rb") as fh:
                data: Mapping[str, Any] = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(
                f"Configuration file {source!r} does not exist. Pass an existing TOML file, "
                "a mapping, or nothing for the defaults."
            ) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"Configuration file {source!r} is not valid TOML: {exc}.") from None
    elif isinstance(config, Mapping):
        data = config
    else:
        raise ConfigError(
            f"config must be a path, a mapping or None, got {type(config).__name__}."
        )
    problems: list[str] = []

    def refuse() -> None:  # every problem found so far, at once
        if problems:
            raise ConfigError(f"Invalid {source}:\n  " + "\n  ".join(sorted(problems))
                              + "\nSee diffract.config for every key and its default.")

    _check(data, _SCHEMA, "", problems)
    refuse()
    par = data.get("parallel", {}) if isinstance(data.get("parallel", {}), Mapping) else {}
    cache = data.get("cache", {}) if isinstance(data.get("cache", {}), Mapping) else {}
    defaults = Config()
    values = {
        "thread_workers": par.get("thread_pool", {}).get("max_workers", defaults.thread_workers),
        "process_workers": par.get("process_pool", {}).get("max_workers",
                                                           defaults.process_workers),
        "executor": par.get("executor", _executor_name(data, defaults.executor)),
        "unit_timeout": float(par.get("unit_timeout", defaults.unit_timeout)),
        "pool_min_seconds": float(par.get("pool_min_seconds", defaults.pool_min_seconds)),
        "cache_max_bytes": cache.get("max_bytes", defaults.cache_max_bytes),
        "cache_headroom": float(cache.get("headroom", defaults.cache_headroom)),
        "chunk_seconds": float((data.get("apply") if isinstance(data.get("apply"), Mapping)
                                else {}).get("chunk_seconds", defaults.chunk_seconds)),
        "profiles": dict(data.get("profile", {})),
        "executors": {k: v for k, v in dict(data.get("executor", {})).items() if k != "name"},
        "prefer": dict(data.get("plugins", {}).get("prefer", {})),
        "kernels": {
            k: dict(v) if isinstance(v, Mapping) else v for k, v in data.get("kernels", {}).items()
        },
    }
    for name, value in values["prefer"].items():
        if not isinstance(value, str):
            problems.append(f"'plugins.prefer.{name}' must be a distribution name, got {value!r}")
    for name, value in values["kernels"].items():
        if not isinstance(value, Mapping):
            problems.append(f"'kernels.{name}' must be a table of keywords, got {value!r}")
    for key in ("thread_workers", "process_workers"):
        if values[key] < 1:
            problems.append(f"max_workers must be at least 1, got {values[key]}")
    if values["cache_max_bytes"] < 0:
        problems.append(f"'cache.max_bytes' must be >= 0, got {values['cache_max_bytes']}")
    if values["unit_timeout"] < 0 or values["pool_min_seconds"] < 0:
        problems.append("'parallel.unit_timeout' and 'parallel.pool_min_seconds' must be >= 0")
    if not values["chunk_seconds"] > 0:
        problems.append(f"'apply.chunk_seconds' must be > 0, got {values['chunk_seconds']}")
    if not 0.0 <= values["cache_headroom"] < 1.0:
        problems.append(f"'cache.headroom' must be in [0, 1), got {values['cache_headroom']}")
    refuse()
    return Config(**values)
