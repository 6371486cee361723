"""Write the Flax checkpoints the format tests read, with flax's own serializer.

    pip install flax   # in a scratch environment: flax pulls in jax
    python tools/flax_fixtures.py

``tests/resources/flax/model.msgpack`` is ``flax.serialization.to_bytes`` of a small
linen model's variables (Dense, Conv, Embed, a bfloat16 Dense, an optimizer-like
``opt_state`` and a step), with ``MAX_CHUNK_SIZE`` lowered so that the larger arrays
are written in flax's chunked layout (the shape as a map, the embedding in 16 chunks);
``expected.npz`` holds every array as ``flax.serialization.msgpack_restore`` reads it
back (bfloat16 as float32: exact), keyed by its dotted path. The files are committed:
the test suite does not need flax (where flax is importable, it also writes and reads a
fresh pair)."""

from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "resources" / "flax"
CHUNK_BYTES = 256  # flax's MAX_CHUNK_SIZE while writing: arrays above it are chunked


def variables():
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    class Net(nn.Module):
        @nn.compact
        def __call__(self, tokens, image):
            x = nn.Embed(64, 16, name="Embed_0")(tokens)
            x = nn.Dense(16, name="Dense_0")(x)
            y = nn.Conv(6, (3, 3), name="Conv_0")(image)
            z = nn.Dense(8, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, name="Half_0")(x)
            return x.sum() + y.sum() + z.sum()

    params = Net().init(jax.random.PRNGKey(7), jnp.zeros((2, 5), jnp.int32),
                        jnp.zeros((1, 8, 8, 4)))
    return {"params": params["params"], "opt_state": {"mu": params["params"]["Dense_0"]},
            "step": 7}


def write(out: Path = OUT) -> None:
    import flax.serialization as fs
    import numpy as np

    tree = variables()
    saved = fs.MAX_CHUNK_SIZE
    fs.MAX_CHUNK_SIZE = CHUNK_BYTES
    try:
        blob = fs.to_bytes(tree)
    finally:
        fs.MAX_CHUNK_SIZE = saved
    back = fs.msgpack_restore(blob)
    flat = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif hasattr(value, "shape"):
                flat[f"{prefix}{key}"] = np.asarray(value, dtype=np.float32)

    walk(back, "")
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.msgpack").write_bytes(blob)
    np.savez(out / "expected.npz", **flat)


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
