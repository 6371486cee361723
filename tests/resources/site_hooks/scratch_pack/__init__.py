"""A fake plugin with one of each new hook: a model format (text files that start with
``SCRATCH``), a view rule (row or column blocks) and a command (``scratch``)."""

import json

import numpy as np

from diffract.plugins import (
    CheckpointReader,
    Command,
    ModelFormat,
    TensorEntry,
    View,
    ViewRule,
    hookimpl,
    to_slices,
)

MAGIC = b"SCRATCH\n"


def save(path, arrays, config=None):
    """Write ``arrays`` (name -> array) as a scratch file: the magic line, then JSON."""
    body = {"config": config or {},
            "tensors": {k: {"dtype": str(np.asarray(v).dtype), "data": np.asarray(v).tolist()}
                        for k, v in arrays.items()}}
    with open(path, "wb") as fh:
        fh.write(MAGIC + json.dumps(body).encode())


class ScratchReader(CheckpointReader):
    reads = []  # (name, index) of every read, for the tests

    def __init__(self, path):
        self.path = str(path)
        with open(path, "rb") as fh:
            self.body = json.loads(fh.read()[len(MAGIC):])

    @property
    def files(self):
        return [self.path]

    def entries(self):
        for name, t in self.body["tensors"].items():
            yield TensorEntry(name, np.shape(t["data"]), t["dtype"])

    def read(self, name, index=None):
        ScratchReader.reads.append((name, index))
        t = self.body["tensors"][name]
        value = np.asarray(t["data"], dtype=t["dtype"])
        return value if index is None else value[to_slices(index)]

    def config(self):
        return self.body["config"]


def blocks(param, config, options):
    """Split a 2-D parameter into ``parts`` equal blocks of rows (axis 0) or columns."""
    parts, axis = options.get("parts", config.get("parts", 2)), options.get("axis", 0)
    if len(param.shape) != 2 or param.shape[axis] % parts:
        return []
    size = param.shape[axis] // parts
    return [View(f"block={i}", (slice(i * size, (i + 1) * size),) if axis == 0
                 else (slice(None), slice(i * size, (i + 1) * size)))
            for i in range(parts)]


def check_blocks(options):
    unknown = sorted(set(options) - {"parts", "axis"})
    problems = [f"unknown option(s) {unknown}; it takes parts and axis"] if unknown else []
    if options.get("axis", 0) not in (0, 1):
        problems.append(f"axis must be 0 or 1, got {options['axis']!r}")
    return problems


def _configure(parser):
    parser.add_argument("--shout", action="store_true")


def _run(args):
    from diffract.plugins import get_catalog

    text = f"scratch: {len(get_catalog().formats)} formats"
    print(text.upper() if args.shout else text)
    return 0


@hookimpl
def diffract_model_formats():
    yield ModelFormat("scratch", ScratchReader, magic=(MAGIC,), description="scratch text")


@hookimpl
def diffract_param_views():
    yield ViewRule("blocks", blocks, "row or column blocks", check=check_blocks)


@hookimpl
def diffract_commands():
    yield Command("scratch", "say how many formats are installed", _configure, _run)
