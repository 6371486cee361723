"""The monitor as a Hugging Face ``transformers.TrainerCallback``.

    trainer = Trainer(model=model, args=TrainingArguments(..., report_to="tensorboard"), ...)
    trainer.add_callback(DiffractCallback(trainer, every=200, store="runs/a.diffract"))
    trainer.train()

The values go out through the trainer's own callbacks' ``on_log`` (so every tracker of
``report_to`` gets them), at the step that was analysed, not the step at which the
analysis finished; ESD histograms go to the TensorBoard writer of the trainer's
TensorBoard callback when there is one. Only rank 0 analyses and logs; the other ranks
take part in gathering sharded (DTensor) parameters. A resumed run
(``resume_from_checkpoint``) continues the same store: steps already analysed there are
not analysed again. ``on_save=True`` also analyses the checkpoints the trainer writes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from diffract_training._setup import monitor_options
from diffract_training.monitor import Monitor, write_histograms

__all__ = ["DiffractCallback"]


class DiffractCallback(TrainerCallback):
    """A :class:`~diffract_training.Monitor` driven by the Trainer's events.

    ``trainer``: the trainer whose callbacks receive the values (without one, only
    ``log=`` gets them). Every other keyword is the monitor's (``every``, ``metrics``,
    ``views``, ``params``, ``store``, ``log``, ``histograms``, ``prefix``), checked here,
    before training; the model is checked when training begins. ``on_save=True`` also
    analyses each checkpoint the trainer writes, from its files (with ``every=None``,
    only those)."""

    def __init__(self, trainer: Any = None, *, on_save: bool = False, **monitor: Any) -> None:
        self.trainer = trainer
        self.on_save_analysis = on_save
        self._options = monitor_options("DiffractCallback", monitor, Monitor)
        self.monitor = self._new_monitor()
        self._args: Any = None
        self._state: Any = None
        self._control: Any = None

    def _new_monitor(self) -> Monitor:
        monitor = Monitor(None, **self._options)  # log= takes one sink or a list
        monitor._sinks.insert(0, self._to_trainer)
        return monitor

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        self._args, self._state, self._control = args, state, control
        if self.monitor.closed:  # a second train(): the first closed its monitor
            self.monitor = self._new_monitor()
        if model is not None:  # on every rank: the monitor knows which one writes
            self.monitor.attach(model)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._args, self._state, self._control = args, state, control
        self.monitor.step(state.global_step)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """With ``on_save=True``: the checkpoint just written (``checkpoint-<step>`` in
        the output folder), from its files, in the background, unless that step was
        analysed live already."""
        self._args, self._state, self._control = args, state, control
        if self.on_save_analysis:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            if folder.is_dir():
                self.monitor.analyse_saved(folder, state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._args, self._state, self._control = args, state, control
        self.monitor.close()

    def _to_trainer(self, values: dict[str, float], spectra: dict[str, Any], step: int,
                    monitor: Monitor) -> None:
        """The values to the trainer's other callbacks' ``on_log`` at ``step`` (not the
        console ones: hundreds of per-layer values), the ESDs to its TensorBoard writer."""
        trainer = self.trainer
        if trainer is None or self._state is None:
            return
        at = copy.copy(self._state)
        at.global_step = step
        for callback in trainer.callback_handler.callbacks:
            if callback is self or isinstance(callback, (ProgressCallback, PrinterCallback)):
                continue
            callback.on_log(self._args, at, self._control, logs=dict(values))
            writer = getattr(callback, "tb_writer", None)
            if writer is not None:
                write_histograms(writer, spectra, step, monitor)
                writer.flush()
