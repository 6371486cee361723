"""The eigensolver called from numpy's own OpenBLAS (issue 39 item 4): the same bits as
scipy's ``eigh(driver="evr")`` on every Gram matrix the ESD forms, thread limits set and
restored, scipy never imported for an ESD, and the fits' batch path giving what one fit
at a time gives."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from diffract_kernels_spectral import _lapack, _taichi, linalg
from diffract_kernels_spectral.kernels_fits import _power_law_fits, power_law_fit

needs_bundled = pytest.mark.skipif(_lapack.library() is None,
                                   reason="numpy is not built on its bundled OpenBLAS")


@needs_bundled
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_same_bits_as_scipy_evr(precision, monkeypatch):
    """Square, tall, wide, a Gram summed block by block, repeated eigenvalues and a
    rank-deficient matrix: the values equal scipy's bit for bit."""
    from scipy.linalg import eigh

    rng = np.random.default_rng(5)
    monkeypatch.setattr(linalg, "GRAM_BLOCK_BYTES", 40_000)  # the blocked sum, small
    low = rng.standard_normal((200, 3)) @ rng.standard_normal((3, 90))
    mats = [rng.standard_normal((64, 64)), rng.standard_t(3, (300, 70)),
            rng.standard_normal((50, 400)), np.kron(np.eye(4), np.ones((8, 8))), low,
            rng.standard_normal((1, 30))]
    dtype = np.dtype(linalg._PRECISIONS[precision])
    for m in mats:
        gram = linalg._gram(m.astype(np.float32), dtype)
        ours = _lapack.eigvalsh(gram.copy())
        theirs = eigh(gram.copy(), eigvals_only=True, driver="evr", check_finite=False)
        assert ours.dtype == theirs.dtype == dtype
        assert np.array_equal(ours, theirs), m.shape


@needs_bundled
def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="square C-contiguous"):
        _lapack.eigvalsh(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="square C-contiguous"):
        _lapack.eigvalsh(np.asfortranarray(np.arange(9.0).reshape(3, 3))[:, :2])
    bad = np.eye(3)
    bad[1, 1] = np.nan
    with pytest.raises(np.linalg.LinAlgError, match="NaN or infinite"):
        _lapack.eigvalsh(bad)


@needs_bundled
def test_one_blas_thread_sets_and_restores_the_count():
    lib = _lapack.library()
    before = lib.get_threads()
    lib.set_threads(2)
    try:
        with linalg.one_blas_thread():
            assert lib.get_threads() == 1
            with linalg.one_blas_thread():  # nested: still one, restored by the outer
                assert lib.get_threads() == 1
            assert lib.get_threads() == 1
        assert lib.get_threads() == 2
    finally:
        lib.set_threads(before)


@needs_bundled
def test_an_esd_does_not_import_scipy():
    code = ("import sys, numpy as np\n"
            "from diffract_kernels_spectral import linalg\n"
            "v = linalg.esd(np.random.default_rng(0).standard_normal((40, 30)))\n"
            "assert len(v) == 30 and v[-1] > 0\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def _fields(result):
    return result if isinstance(result, BaseException) else tuple(result)


def test_the_fits_batch_gives_what_one_fit_at_a_time_gives(monkeypatch):
    """Same values, failures and undefined fields in place; then which units run on the
    threads: those the dense scan fits and large enough to pay for threads (the bounds
    moved to 250 and 400 points to see the rest run here), none once Taichi has started."""
    rng = np.random.default_rng(11)
    spectra = [np.sort(rng.pareto(2.0 + i / 4, 300 + 37 * i) + 1.0) for i in range(7)]
    spectra.insert(2, np.array([1.0, 2.0]))  # too few points: FitError in place
    spectra.insert(4, np.full(200, 3.0))  # all equal: FieldUndefined in place
    units = [{"esd": s} for s in spectra]
    for config in ({}, {"min_tail": 20, "fix_fingers": "clip_xmax"}):
        one_by_one = []
        for s in spectra:
            try:
                one_by_one.append(power_law_fit(s, **config))
            except Exception as exc:  # noqa: BLE001 - compared below
                one_by_one.append(exc)
        batch = _power_law_fits(units, **config)
        assert len(batch) == len(units)
        for ours, theirs in zip(batch, one_by_one, strict=True):
            if isinstance(theirs, BaseException):
                assert type(ours) is type(theirs) and str(ours) == str(theirs)
            else:
                assert np.array_equal(np.array(ours), np.array(theirs))
    # which run threaded: only what the dense scan fits, Taichi not started (an earlier
    # test of the suite may have started it: the dense scan is what this part is about)
    monkeypatch.setattr(_taichi, "running", lambda: False)
    seen = []
    monkeypatch.setattr(linalg, "parallel_map",
                        lambda fn, items: seen.extend(items) or [fn(i) for i in items])
    monkeypatch.setattr("diffract_kernels_spectral.kernels_fits.DENSE_MAX_POINTS", 400)
    monkeypatch.setattr("diffract_kernels_spectral.kernels_fits.THREADED_MIN_POINTS", 250)
    _power_law_fits(units)
    # 300, 337 and 374 points; not the two points (fitted by the powerlaw library: under
    # MIN_POINTS_ACCELERATED), nor the 200 (all equal: too few to pay), nor 411 and more
    assert seen == [0, 1, 3]
    monkeypatch.setattr("diffract_kernels_spectral.kernels_fits.THREADED_MIN_POINTS", 200)
    seen.clear()
    _power_law_fits(units)
    assert seen == [0, 1, 3, 4]
    monkeypatch.setattr(_taichi, "running", lambda: True)  # once Taichi runs: none
    seen.clear()
    _power_law_fits(units)
    assert seen == []


def test_without_the_bundled_library_scipy_gives_the_same_values(monkeypatch):
    """A numpy on another BLAS (conda, MKL): the ESD takes scipy's route, thread limits by
    threadpoolctl, with the values the bundled route gives (where there is one)."""
    rng = np.random.default_rng(8)
    mats = [rng.standard_normal((120, 80)), rng.standard_t(4, (60, 200)).astype(np.float32)]
    bundled = [linalg.esd(m) for m in mats] if _lapack.library() is not None else None
    monkeypatch.setattr(_lapack, "library", lambda: None)
    values = [linalg.esd(m) for m in mats]
    reference = [np.sort(np.linalg.eigvalsh(linalg._gram(m, np.dtype(np.float64))))
                 for m in mats]
    for v, r in zip(values, reference, strict=True):
        np.testing.assert_allclose(v, r, rtol=1e-10, atol=1e-12 * r[-1])
    if bundled is not None:
        assert all(np.array_equal(a, b) for a, b in zip(values, bundled, strict=True))


def test_parallel_map_keeps_openmp_to_one_thread_per_worker():
    """The decompositions' worker threads open torch's OpenMP regions on one thread each
    (see diffract.plugins.one_openmp_thread); the caller keeps its count."""
    import os

    torch = pytest.importorskip("torch")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("parallel_map runs inline on one core")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert linalg.parallel_map(lambda _: torch.get_num_threads(), [0, 1]) == [1, 1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_overlapping_parallel_maps_share_the_cores():
    """Two calls at once (the runner overlaps chunks' batches) run at most one item per
    CPU between them, and a call made from inside an item runs inline on that item's
    core (no deadlock on the permits)."""
    import os
    import threading

    cpus = len(os.sched_getaffinity(0))
    lock = threading.Lock()
    active, most = [0], [0]
    # the items holding the cores meet here (an event, not a time: every permit is in
    # use at once, however busy the machine); 60 s is only a safety net
    together = threading.Barrier(cpus, timeout=60)

    def item(_):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        together.wait()
        with lock:
            active[0] -= 1
        return threading.get_ident()

    results = {}
    calls = [threading.Thread(target=lambda k=k: results.__setitem__(
        k, linalg.parallel_map(item, range(4 * cpus)))) for k in range(2)]
    for call in calls:
        call.start()
    for call in calls:
        call.join()
    assert most[0] == cpus
    assert all(len(results[k]) == 4 * cpus for k in range(2))
    assert not any(isinstance(r, Exception) for k in range(2) for r in results[k])
    inner = linalg.parallel_map(lambda _: linalg.parallel_map(lambda _: threading.get_ident(),
                                                              range(3)), range(cpus))
    assert all(len(set(ids)) == 1 for ids in inner)  # each inner call on one thread
