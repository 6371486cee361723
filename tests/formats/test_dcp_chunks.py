"""DCP tensors of many chunks (issue 56 item 2): the tiling of a tensor by its chunks is
checked in O(n log n), with the answers of the pairwise check: exact tilings (rows per
rank, a grid of ranks, bricks, a stack of experts) pass, overlapping and gapped ones are
refused. Large layouts run under a timeout generous enough that only a quadratic check
misses it (20,000 chunks took the pairwise check over two minutes); no time is asserted.
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
import signal
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
meta = pytest.importorskip("torch.distributed.checkpoint.metadata")

from torch.distributed.checkpoint.filesystem import _StorageInfo  # noqa: E402

from diffract import Session  # noqa: E402
from diffract.errors import ModelSourceError  # noqa: E402
from diffract_formats import dcp_reader  # noqa: E402
from diffract_formats.dcp_reader import _tiling_problem  # noqa: E402


@contextlib.contextmanager
def _at_most(seconds: int):
    """Fail when the block runs past ``seconds`` (a guard against a quadratic check, far
    above what the check takes on a busy machine; not a measurement)."""
    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: the check is not n log n")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _pairwise(shape, chunks) -> str | None:
    """The reference: every pair of chunks compared (quadratic: small layouts only)."""
    covered = sum(int(np.prod(n)) for _, n in chunks)
    if covered != int(np.prod(shape)):
        return "cover"
    boxes = [c for c in chunks if int(np.prod(c[1]))]
    for (ao, an), (bo, bn) in itertools.combinations(boxes, 2):
        if all(a < b + m and b < a + n for a, n, b, m in zip(ao, an, bo, bn, strict=True)):
            return "overlap"
    return None


def _kind(answer: str | None) -> str | None:
    return None if answer is None else "cover" if answer.startswith("they cover") else (
        "overlap" if "overlap" in answer else answer)


def _cuts(rng, size: int, parts: int) -> list[int]:
    """``parts`` + 1 boundaries from 0 to ``size`` (uneven parts, some empty)."""
    inner = sorted(rng.integers(0, size + 1, parts - 1).tolist())
    return [0, *inner, size]


def _grid(rng, shape, parts) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """A grid of ranks: each axis cut in ``parts[a]`` uneven pieces."""
    cuts = [_cuts(rng, s, p) for s, p in zip(shape, parts, strict=True)]
    return [(tuple(c[i] for c, i in zip(cuts, idx, strict=True)),
             tuple(c[i + 1] - c[i] for c, i in zip(cuts, idx, strict=True)))
            for idx in itertools.product(*(range(p) for p in parts))]


def _bricks(rng, rows: int, cols: int, per_row: int):
    """Rows of bricks, each row cut at its own columns: an exact tiling on no grid."""
    out = []
    for r in range(rows):
        cut = _cuts(rng, cols, per_row)
        out += [((r, a), (1, b - a)) for a, b in zip(cut, cut[1:], strict=False)]
    return out


class TestAnswers:
    @pytest.mark.parametrize("seed", range(40))
    def test_small_layouts_get_the_pairwise_answer(self, seed):
        """Grids, bricks and stacks, exact or spoiled (a chunk moved, grown, dropped or
        doubled): the same verdict as comparing every pair."""
        rng = np.random.default_rng(seed)
        layout = seed % 3
        if layout == 0:
            shape = (int(rng.integers(4, 30)), int(rng.integers(4, 30)))
            chunks = _grid(rng, shape, (int(rng.integers(1, 5)), int(rng.integers(1, 5))))
        elif layout == 1:
            shape = (int(rng.integers(2, 8)), int(rng.integers(8, 30)))
            chunks = _bricks(rng, *shape, per_row=int(rng.integers(1, 5)))
        else:
            shape = (int(rng.integers(2, 6)), int(rng.integers(4, 12)), int(rng.integers(4, 9)))
            chunks = _grid(rng, shape, (int(rng.integers(1, 4)), int(rng.integers(1, 3)), 2))
        spoil = seed % 4
        if spoil and len(chunks) > 1:
            i = int(rng.integers(0, len(chunks)))
            offsets, sizes = chunks[i]
            if spoil == 1:  # moved by one along an axis where it fits
                axis = int(np.argmax(np.array(shape) - np.array(offsets) - np.array(sizes)))
                moved = list(offsets)
                moved[axis] = max(0, moved[axis] - 1) if offsets[axis] else moved[axis] + 1
                moved[axis] = min(moved[axis], shape[axis] - sizes[axis])
                chunks[i] = (tuple(moved), sizes)
            elif spoil == 2:
                chunks.pop(i)
            else:
                chunks.append(chunks[i])
        want = _pairwise(shape, chunks)
        assert _kind(_tiling_problem(shape, chunks)) == want, (shape, chunks)

    def test_a_layout_cut_finer_than_the_check_marks_is_refused_saying_why(self, monkeypatch):
        monkeypatch.setattr(dcp_reader, "MAX_GRID_CELLS", 100)
        chunks = _bricks(np.random.default_rng(0), 10, 200, per_row=20)
        filled = [c for c in chunks if c[1][1]]
        assert _tiling_problem((10, 200), chunks).startswith(
            f"their {len(filled)} chunks cut it into")


class TestManyChunks:
    """Layouts of 100,000 chunks: one row per rank (shuffled), a 320 x 320 grid of ranks,
    each exact, then overlapping or gapped by one entry."""

    def _rows(self, n: int, rng) -> list:
        chunks = [((i, 0), (1, 8)) for i in range(n)]
        return [chunks[i] for i in rng.permutation(n)]

    def test_exact_tilings_pass(self):
        rng = np.random.default_rng(1)
        grid = _grid(rng, (4000, 6400), (320, 320))
        with _at_most(120):
            assert _tiling_problem((100_000, 8), self._rows(100_000, rng)) is None
            assert _tiling_problem((4000, 6400), grid) is None

    def test_one_entry_of_overlap_or_gap_is_found(self):
        rng = np.random.default_rng(2)
        rows = sorted(self._rows(100_000, rng))
        grown = list(rows)
        grown[10] = ((10, 0), (2, 8))  # reaches into row 11...
        grown[50_000] = ((50_000, 0), (0, 8))  # ...and row 50,000 is empty: same count
        with _at_most(120):
            assert _tiling_problem((100_000, 8), grown) == "two of them overlap"
            assert _tiling_problem((100_000, 8), rows[:-1]).startswith(
                "they cover 799992 of 800000 entries")
            grid = _grid(rng, (4000, 6400), (320, 320))
            (o0, o1), (n0, n1) = grid[7]
            grid[7] = ((o0, o1), (n0, n1 + 1))  # one column into its neighbour
            grid[8] = (grid[8][0], (grid[8][1][0], grid[8][1][1] - 1 if grid[8][1][1] else 0))
            assert _tiling_problem((4000, 6400), grid) is not None


def _write(folder: Path, n: int, *, overlap: bool = False) -> Path:
    """A DCP folder whose tensor ``w`` [n, 4] is stored as n chunks of one row (as n ranks
    would write it), every chunk's bytes in one file (not read: adding reads metadata)."""
    folder.mkdir(parents=True)
    rows = [(i, 1) for i in range(n)]
    if overlap:
        rows[1], rows[5] = (1, 2), (5, 0)  # row 1 reaches into row 2, row 5 is left empty
    chunks = [meta.ChunkStorageMetadata(offsets=torch.Size([r, 0]), sizes=torch.Size([k, 4]))
              for r, k in rows]
    data = meta.Metadata(
        state_dict_metadata={"w": meta.TensorStorageMetadata(
            meta.TensorProperties(dtype=torch.float32), torch.Size([n, 4]), chunks)},
        storage_data={meta.MetadataIndex("w", torch.Size([r, 0])): _StorageInfo(
            "__0_0.distcp", 32 * i, 32) for i, (r, _) in enumerate(rows)})
    (folder / ".metadata").write_bytes(pickle.dumps(data))
    with open(folder / "__0_0.distcp", "wb") as fh:
        fh.truncate(32 * n)
    return folder


def test_a_checkpoint_of_20000_chunks_per_tensor_is_added(tmp_path):
    """The whole add (the metadata read safely, every chunk checked) of a tensor written
    by 20,000 ranks; the same with two chunks overlapping is refused naming the tensor."""
    with warnings.catch_warnings(), _at_most(120):
        with Session() as s:
            s.models.add(_write(tmp_path / "ok", 20_000), "m")
            assert [(p.name, p.shape) for p in s.models.params("m")] == [("w", (20_000, 4))]
        with Session() as s, pytest.raises(ModelSourceError, match=r"tensor 'w': its chunks "
                                                                   r"do not tile its shape "
                                                                   r"\(20000, 4\) \(two of "
                                                                   r"them overlap\)"):
            s.models.add(_write(tmp_path / "bad", 20_000, overlap=True), "m")
