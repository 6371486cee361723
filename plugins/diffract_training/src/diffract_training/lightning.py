"""The monitor as a Lightning ``Callback``.

    trainer = L.Trainer(max_steps=..., logger=TensorBoardLogger("logs"),
                        callbacks=[DiffractLightningCallback(every=200, store="runs/a.diffract")])

The values go to every logger of the trainer (``logger.log_metrics(values, step)``) at
the step that was analysed; ESD histograms to the ones whose ``experiment`` is a
TensorBoard ``SummaryWriter``. Under torch.distributed every rank analyses its share of
the matrices; rank 0 alone logs and writes the store, and every rank's schedules set the
same factors at the same step. A run
resumed with ``ckpt_path`` continues the same store: steps already analysed there are
not analysed again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback

from diffract_training._setup import monitor_options
from diffract_training._sinks import write_histograms
from diffract_training.monitor import Monitor
from diffract_training.schedules import check_schedules, restore_states, saved_states

__all__ = ["DiffractLightningCallback"]


class DiffractLightningCallback(Callback):
    """A :class:`~diffract_training.Monitor` driven by Lightning's hooks; its keywords
    (``every``, ``metrics``, ``views``, ``params``, ``store``, ``log``, ``histograms``,
    ``prefix``, ``background``) are checked here, before training; the module when
    training starts. ``schedules``: :class:`~diffract_training.TempBalance` and the
    others, built without model and optimizer; the trainer's are handed to them when
    training starts, and the optimizers' groups given back when it ends."""

    def __init__(self, *, schedules: Sequence[Any] = (), **monitor: Any) -> None:
        super().__init__()
        self.schedules = check_schedules("DiffractLightningCallback", schedules)
        self._options = monitor_options("DiffractLightningCallback", monitor, Monitor)
        self.monitor = self._new_monitor()
        self._trainer: Any = None
        self._resumed: Any = None  # the schedules' state from the checkpoint resumed

    def state_dict(self) -> dict[str, Any]:
        """The schedules' state, kept in Lightning's checkpoints (a run resumed with
        ``ckpt_path`` carries on with the same factors and ramp)."""
        return saved_states(self.schedules) if self.schedules else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resumed = state_dict or None  # applied once the schedules are attached

    def _new_monitor(self) -> Monitor:
        monitor = Monitor(None, **self._options)  # log= takes one sink or a list
        monitor.role = (f"DiffractLightningCallback(schedules="  # the ranks compare it at attach
                        f"{[type(s).__name__ for s in self.schedules]})")
        monitor._sinks.insert(0, self._to_loggers)
        return monitor

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._trainer = trainer
        if self.monitor.closed:  # a second fit(): the first closed its monitor
            self.monitor = self._new_monitor()
        self.monitor.attach(pl_module)  # on every rank: the monitor knows which one writes
        for schedule in self.schedules:
            schedule.attach(pl_module, list(trainer.optimizers), trainer.global_step)
        if self.schedules and trainer.global_step > 0:  # resumed with ckpt_path
            resumed, self._resumed = self._resumed, None
            restore_states("DiffractLightningCallback", self.schedules, resumed,
                           "the checkpoint resumed")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.monitor.step(trainer.global_step)
        for schedule in self.schedules:
            schedule.step(trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        try:
            self.monitor.close()
        finally:
            for schedule in reversed(self.schedules):  # the last split first
                schedule.close()

    def _to_loggers(self, values: dict[str, float], spectra: dict[str, Any], step: int,
                    monitor: Monitor) -> None:
        for logger in getattr(self._trainer, "loggers", None) or []:
            logger.log_metrics(dict(values), step=step)
            write_histograms(getattr(logger, "experiment", None), spectra, step, monitor)
            logger.save()
