"""Byte-mutation fuzzing of safetensors headers: every file the reader refuses must be
refused with a ModelSourceError (the documented error), never another exception.

    python tools/fuzz_safetensors.py [--seconds 60] [--seed 0]

The test suite runs a bounded, seeded version (tests/formats/test_hostile.py).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from diffract.errors import ModelSourceError
from diffract.plugins import get_catalog


def valid_file(path: Path) -> bytes:
    """A small valid safetensors file (three tensors, metadata), as bytes."""
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 4)).astype(np.float32),
               "b": rng.standard_normal((2, 2)).astype(np.float16),
               "c": np.arange(6, dtype=np.int64)}
    header: dict = {"__metadata__": {"format": "pt"}}
    data, offset = b"", 0
    kinds = {"float32": "F32", "float16": "F16", "int64": "I64"}
    for name, value in tensors.items():
        raw = value.tobytes()
        header[name] = {"dtype": kinds[value.dtype.name], "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        data, offset = data + raw, offset + len(raw)
    body = json.dumps(header).encode()
    blob = len(body).to_bytes(8, "little") + body + data
    path.write_bytes(blob)
    return blob


def mutate(blob: bytes, rng: random.Random) -> bytes:
    """1-4 mutations, mostly inside the header: flips, replacements with interesting
    bytes or digits, insertions, deletions, a changed length prefix."""
    out = bytearray(blob)
    header_end = 8 + int.from_bytes(blob[:8], "little")
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        at = rng.randrange(0, min(len(out), header_end + 4)) if out else 0
        if kind < 0.3 and out:
            out[at] ^= 1 << rng.randrange(8)
        elif kind < 0.6 and out:
            out[at] = ord(rng.choice('0123456789-+.eE[]{}":,tfn\\ '))
        elif kind < 0.75:
            out[at:at] = rng.choice([b"9" * rng.randint(1, 30), b"Infinity", b"-", b"1e999",
                                     b"[", b"{", b'"x":', b"\xff\xfe"])
        elif kind < 0.9 and out:
            del out[at:at + rng.randint(1, 8)]
        else:
            out[:8] = rng.randrange(0, 1 << rng.choice([8, 16, 32, 63])).to_bytes(8, "little")
    return bytes(out)


def run(iterations: int | None, seconds: float, seed: int) -> tuple[int, int, list[str]]:
    """(files tried, files refused, unexpected errors as text)."""
    fmt = get_catalog().formats["safetensors"]
    rng = random.Random(seed)
    tried = refused = 0
    unexpected: list[str] = []
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = Path(folder) / "f.safetensors"
        blob = valid_file(path)
        deadline = time.monotonic() + seconds
        while (iterations is None or tried < iterations) and time.monotonic() < deadline:
            mutated = mutate(blob, rng)
            path.write_bytes(mutated)
            tried += 1
            try:
                reader = fmt.open(str(path))
                for entry in reader.entries():
                    reader.read_numpy(entry.name)
            except ModelSourceError:
                refused += 1
            except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for
                unexpected.append(f"{type(exc).__name__}: {exc} <- {mutated[:120]!r}")
    return tried, refused, unexpected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tried, refused, unexpected = run(None, args.seconds, args.seed)
    print(f"{tried} mutated files, {refused} refused with ModelSourceError, "
          f"{len(unexpected)} other exceptions")
    for line in unexpected[:20]:
        print("  " + line)
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
