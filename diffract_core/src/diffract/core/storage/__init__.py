"""Storage profiles: the contract (:class:`Store`) and the built-in ``ram`` profile."""

from diffract.core.storage.base import (
    Batch,
    Note,
    ParamInfo,
    Provenance,
    Stamp,
    Store,
    contextual_name,
    estimate_nbytes,
    split_contextual,
    storable_problem,
)
from diffract.core.storage.ram import RamStore

__all__ = [
    "Batch",
    "Note",
    "ParamInfo",
    "Provenance",
    "Stamp",
    "RamStore",
    "Store",
    "contextual_name",
    "estimate_nbytes",
    "split_contextual",
    "storable_problem",
]
