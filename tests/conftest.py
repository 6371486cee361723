"""Shared fixtures: a fresh kernel registry per test, small models.

Without a CUDA GPU, Triton runs in its interpreter on CPU tensors: TRITON_INTERPRET must
be set before anything imports triton, so it is set here, at collection, together with
kernel-fun's switch that admits CPU tensors (KERNEL_FUN_INTERPRET). On a GPU machine set
KERNEL_FUN_TEST_GPU=1 to run the kernel-fun tests on the device instead.
"""

from __future__ import annotations

import os

if os.environ.get("KERNEL_FUN_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("KERNEL_FUN_INTERPRET", "1")

import signal  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# A suite started in the background by a shell (`cmd &`, nohup) inherits SIGINT ignored,
# and so would every process a test starts (an ignored signal stays ignored across exec,
# and Python then installs no KeyboardInterrupt): the Ctrl-C tests would test nothing.
# A handled signal is reset to its default at exec: the children get a terminal's Ctrl-C.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from diffract.plugins import reset_registry  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` show as skipped, with the reason, unless they run on a GPU."""
    if os.environ.get("KERNEL_FUN_TEST_GPU") == "1":
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA GPU (bf16 and the compiled kernels): run with KERNEL_FUN_TEST_GPU=1"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def fresh_registry():
    """Each test starts from the registry the installed plugins give (process-global)."""
    reset_registry()
    yield
    reset_registry()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def arrays(rng):
    """A small state dict of numpy arrays: two matrices, a conv kernel, a bias."""
    return {
        "layer0.weight": rng.standard_normal((16, 8)),
        "layer1.weight": rng.standard_normal((8, 12)),
        "conv.weight": rng.standard_normal((6, 3, 2)),
        "layer1.bias": rng.standard_normal(12),
    }


@pytest.fixture
def session():
    from diffract import Session

    with Session(profile="ram", config={"parallel": {"executor": "sequential"}}) as s:
        yield s


@pytest.fixture
def tool():
    """Load a script of ``tools/`` as a module: ``tool("sizes")``."""
    import importlib.util
    import sys
    from pathlib import Path

    def load(name: str):
        path = Path(__file__).resolve().parent.parent / "tools" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def example_pack(tmp_path_factory, monkeypatch):
    """The example pack under examples/, discoverable by its entry point: as installed
    by ``./dev test``, else put on the path here as a distribution (its ``.dist-info``
    beside its sources), with the plugin manager rebuilt to find it, and restored after."""
    import importlib
    import importlib.metadata
    import sys
    from pathlib import Path

    from diffract.plugins import set_plugin_manager

    try:
        importlib.metadata.distribution("diffractml-example-pack")
        yield
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    pack = Path(__file__).parents[1] / "examples" / "diffractml-example-pack"
    site = tmp_path_factory.mktemp("site")
    info = site / "diffractml_example_pack-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: diffractml-example-pack\n"
                                   "Version: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[diffract]\ndiffractml-example-pack = diffract_example_pack.plugin\n")
    monkeypatch.setattr(sys, "path", [str(site), str(pack / "src"), *sys.path])
    importlib.invalidate_caches()
    previous = set_plugin_manager(None)
    try:
        yield
    finally:
        set_plugin_manager(previous)
        for name in [m for m in sys.modules if m.split(".")[0] == "diffract_example_pack"]:
            del sys.modules[name]
