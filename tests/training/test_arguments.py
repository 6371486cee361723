"""A monitor's and its callbacks' arguments (issue 56 items 3 and 4): every wrong value
is an InvalidArgumentError saying what is accepted, raised before anything is made (no
session, no store folder); a single view name names one view; the global step is a
whole number; a store on a read-only file system is a StorageError; a Lightning or
Hugging Face callback reused for a second fit analyses again."""

from __future__ import annotations

import errno

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from diffract import Session  # noqa: E402
from diffract.errors import InvalidArgumentError, StorageError  # noqa: E402
from diffract_training import Monitor, _setup  # noqa: E402
from tests.resources.lightning import module as lightning_module  # noqa: E402


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"metrics": None}, r"metrics takes a name or a list of names, got None"),
    ({"metrics": 42}, r"metrics takes a name or a list of names, got 42"),
    ({"view_metrics": [1]}, r"view_metrics takes a name or a list of names, got \[1\]"),
    ({"params": 42}, r"params takes a name or a list of names \(or None\), got 42"),
    ({"views": [1]}, r"views takes a name or a list of names \(or None\), got \[1\]"),
    ({"view_options": [1]}, r"view_options takes a mapping of option names"),
    ({"store": 42}, r"store takes a folder's path \(a str or Path without NUL\), got 42"),
    ({"store": "a\x00b"}, r"store takes a folder's path .*got 'a\\x00b'"),
    ({"copy_limit": float("nan")}, r"copy_limit takes a share .*got nan"),
    ({"prefix": None}, r"prefix takes the logged names' first part \(a str\), got None"),
    ({"histograms": "no"}, r"histograms takes True or False, got 'no'"),
    ({"background": "no"}, r"background takes True or False, got 'no'"),
], ids=lambda v: str(v)[:30] if isinstance(v, dict) else None)
def test_a_wrong_value_is_refused_before_anything_is_made(kwargs, match, tmp_path,
                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgumentError, match=rf"^Monitor: .*{match}"):
        Monitor(_net(), **kwargs)
    assert list(tmp_path.iterdir()) == []  # no folder named 42 left behind


def test_every_problem_is_said_at_once():
    with pytest.raises(InvalidArgumentError, match=r"background takes .*; histograms takes "
                                                   r".*; metrics takes"):
        Monitor(_net(), metrics=None, histograms=1, background=None)


def test_a_single_view_name_is_one_view():
    torch.manual_seed(0)
    attention = torch.nn.ModuleDict({"q_proj": torch.nn.Linear(8, 8, bias=False)})
    with Monitor(attention, views="heads", view_options={"heads": 2}, every=1,
                 background=False, metrics=["stable_rank"]) as m:
        assert m._views == ["heads"]
        m.step(1)
        assert any("[head=" in name for name in m.session.results.export_metrics(
            "stable_rank")["step-1"])


@pytest.mark.parametrize("step", ["x", None, 1.5, -1, True])
def test_a_step_that_is_no_whole_number_is_refused(step):
    with Monitor(_net(), every=1, background=False, metrics=["stable_rank"]) as m:
        with pytest.raises(InvalidArgumentError, match=r"the global step is a whole number"):
            m.step(step)
        with pytest.raises(InvalidArgumentError, match=r"the global step is a whole number"):
            m.analyse_saved("nowhere", step)
        assert m.step(np.int64(2)) and m.analysed == [2]  # numpy's ints are steps


def test_a_store_on_a_read_only_file_system_is_a_storage_error(tmp_path, monkeypatch):
    """An existing store (a new one there already got a StorageError from the store):
    the monitor's lock file cannot be made; simulated, as a test cannot mount."""
    Session("local", path=str(tmp_path / "s")).close()

    def read_only(path, mode="r", *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(_setup, "open", read_only, raising=False)
    with pytest.raises(StorageError, match=r"the store .*s' cannot be written \(Read-only "
                                           r"file system\): .*writable file system"):
        Monitor(_net(), store=tmp_path / "s")


def test_a_callback_with_an_unknown_keyword_says_what_it_takes():
    pytest.importorskip("lightning")
    from diffract_training import DiffractLightningCallback

    with pytest.raises(InvalidArgumentError, match=r"unknown keyword\(s\) \['evry'\]\. Did "
                                                   r"you mean 'every'\? It takes the monitor's"):
        DiffractLightningCallback(evry=3)


def test_a_lightning_callback_reused_for_a_second_fit_analyses_again():
    L = pytest.importorskip("lightning.pytorch")
    from diffract_training import DiffractLightningCallback

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.randn(64, 8, generator=torch.Generator().manual_seed(0))), batch_size=8)
    logged: list[int] = []
    cb = DiffractLightningCallback(every=2, metrics=["stable_rank"], background=False,
                                   log=lambda values, step: logged.append(step))
    for _ in range(2):
        trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False,
                            callbacks=[cb], enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False)
        trainer.fit(lightning_module(_net()), data)
    assert logged == [2, 4, 2, 4]


def test_the_kernels_configuration_is_frozen_when_the_monitor_starts():
    """A configure_kernel elsewhere in the process after the monitor started changes
    nothing of its numbers (kernel configuration is process-global); a monitor started
    after it uses it."""
    from diffract.plugins import get_registry

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(300, 200))
    values = {}
    for when in ("before", "after"):
        get_registry().reset_configuration()
        if when == "before":
            get_registry().configure("power_law_fit", min_tail=5)
        with Monitor(model, every=1, background=False, metrics=["pl_n_tail"]) as m:
            get_registry().configure("power_law_fit", min_tail=150)  # mid-run, elsewhere
            m.step(1)
            values[when] = m.session.results.export_metrics("pl_n_tail")["step-1"]["0.weight"]
    get_registry().reset_configuration()
    esd = np.sort(np.linalg.svd(model[0].weight.detach().double().numpy(),
                                compute_uv=False) ** 2)
    from diffract_kernels_spectral import fit_power_law

    assert values["before"]["pl_n_tail"] == fit_power_law(esd, min_tail=5).n_tail
    assert values["after"]["pl_n_tail"] == fit_power_law(esd, min_tail=50).n_tail
    assert fit_power_law(esd, min_tail=150).n_tail != fit_power_law(esd, min_tail=50).n_tail
