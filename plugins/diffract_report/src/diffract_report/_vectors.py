"""What a tracked run keeps of the singular vectors its alignment reads: the svd kernel's
settings for the run, and what each round erases once its pairs are computed."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["PAIRWISE_INTERMEDIATES", "SVD_GROUP", "TRACK_SVD", "prune", "svd_setting_restored",
           "svd_settings", "views_of"]

#: What the alignment fields were computed from and no later round reads: the pairwise
#: overlap matrices (k x k per layer and pair), every checkpoint's right singular vectors
#: but those of head views (whose change is read on both sides: r_subspace_overlap), and
#: the left ones of every checkpoint but the first (the reference) and the latest (the
#: next one's predecessor).
PAIRWISE_INTERMEDIATES = ("l_overlap",)
SVD_GROUP = ("weights_lsvs", "weights_svals", "weights_rsvs")


def prune(session: Any, ids: Sequence[str], asked: set[str], first: bool = True) -> None:
    """Erase what the later rounds do not need (see PAIRWISE_INTERMEDIATES), so that a
    checkpoint grows the store by its scalars and spectra, not by its singular vectors;
    the alignment values are those of the same vectors kept (they are computed before
    this). A field the user asked for stays; the first checkpoint's vectors stay only
    when the run is aligned with it (``first``)."""
    known = set(session.compute.list_available_metrics())
    pairwise = [f for f in PAIRWISE_INTERMEDIATES if f in known and f not in asked]
    if pairwise:
        session.results.erase(*pairwise)
    if not set(SVD_GROUP) <= known or asked & set(SVD_GROUP):
        return
    kept = list(dict.fromkeys([*ids[:1 if first else 0], *ids[-1:]]))
    gone = [m for m in ids if m not in kept]
    if gone:  # the whole group: a unit is recomputed only when all of it is absent
        session.filter(model_ids=gone).results.erase(*SVD_GROUP)
    whole = sorted({p.name for m in kept for p in session.models.params(m)} - set(
        views_of(session)))
    if kept and whole:  # a head's right vectors stay: its input side is compared
        session.filter(model_ids=kept, param_names=whole).results.erase("weights_rsvs")


def views_of(session: Any) -> list[str]:
    """The names of the views (heads...) of the run's checkpoints."""
    return sorted({p.name for m in session.model_ids for p in session.models.params(m)
                   if p.parent is not None})


@contextlib.contextmanager
def svd_setting_restored(session: Any) -> Iterator[None]:
    """The svd kernel's settings as they were once the track ends (kernel configuration
    is process-wide; :func:`_svd_settings` sets them for the run)."""
    if "svd" not in session.compute.list_available_kernels():
        yield
        return
    config = session.compute.kernel_config("svd")
    before = {k: config[k] for k in TRACK_SVD}
    try:
        yield
    finally:
        session.compute.configure_kernel("svd", **before)


#: What a tracked run keeps of the vectors it stores for its next checkpoints (the svd
#: kernel's settings): those of the top tenth of the directions, what its alignment fields
#: read (the top-tenth subspace overlap, the agreements among those directions), in
#: float32 (half the bytes; the fields move by 1e-9). A bfloat16 OLMo-2-1B checkpoint's
#: float32 vectors take 1.7x its bytes; their top tenth 0.17x.
TRACK_SVD = {"vectors": "float32", "vector_share": 0.1}


def svd_settings(session: Any, ids: Sequence[str], settings: Sequence[str]) -> None:
    """The svd settings of the run (TRACK_SVD), except that a store which holds vectors
    already keeps the settings they were computed with (a run tracked before goes on as
    it was: nothing stale, no reference recomputed from a checkpoint that may be gone),
    and ``--set svd.<option>=...`` wins over both."""
    if not ids or "svd" not in session.compute.list_available_kernels():
        return
    given = {t.split("=", 1)[0].strip() for t in settings}
    chosen = dict(TRACK_SVD)
    for model_id in ids:
        stamps = session.store.stamps(model_id, "weights_lsvs")
        if stamps:
            stored = json.loads(next(iter(stamps.values())).provenance.config)
            defaults = session.registry.get("svd").config_defaults
            chosen = {k: stored.get(k, defaults[k]) for k in TRACK_SVD}
            break
    chosen = {k: v for k, v in chosen.items() if f"svd.{k}" not in given}
    if chosen:
        session.compute.configure_kernel("svd", **chosen)
