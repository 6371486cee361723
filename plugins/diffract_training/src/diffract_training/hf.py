"""The monitor as a Hugging Face ``transformers.TrainerCallback``, passed as the
documentation passes callbacks:

    trainer = Trainer(model=model, args=TrainingArguments(..., report_to="tensorboard"),
                      callbacks=[DiffractCallback(every=200, store="runs/a.diffract")], ...)
    trainer.train()

(``trainer.add_callback(DiffractCallback(...))`` works the same.) The values go out
through the trainer's other callbacks' ``on_log`` (so every tracker of ``report_to`` gets
them, TensorBoard in the trainer's own event file), at the step that was analysed, not
the step at which the analysis finished; ESD histograms go to the TensorBoard writer of
the trainer's TensorBoard callback when there is one. The callbacks are those of the
trainer's callback handler, which calls this one's events: at the start of training it
moves this callback to the front of the handler's list, so that at the end of training
the final step's values reach the trackers before they close their files. Where no
handler calls it (a loop that calls the events itself) it needs ``trainer=`` or
``report_to`` empty, and says so at the start of training. Under torch.distributed
every rank analyses its share of the matrices and hands its values to the others; rank 0
alone logs and writes the store, and every rank's schedules set the same factors at the
same step. A resumed run
(``resume_from_checkpoint``) continues the same store: steps already analysed there are
not analysed again. ``on_save=True`` also analyses the checkpoints the trainer writes.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from diffract.errors import InvalidArgumentError
from diffract_training._setup import monitor_options
from diffract_training._sinks import write_histograms
from diffract_training.monitor import Monitor
from diffract_training.schedules import check_schedules, restore_states, saved_states

__all__ = ["DiffractCallback", "SCHEDULES_FILE"]

log = logging.getLogger("diffract_training")

#: The schedules' state in each checkpoint folder the trainer writes (read on resume).
SCHEDULES_FILE = "diffract_schedules.json"


class DiffractCallback(TrainerCallback):
    """A :class:`~diffract_training.Monitor` driven by the Trainer's events.

    ``trainer``: optional; the callbacks that receive the values are the trainer's
    (found from the handler that calls this callback's events). Every other keyword is
    the monitor's (``every``, ``metrics``, ``views``, ``params``, ``store``, ``log``,
    ``histograms``, ``prefix``, ``final``...), checked here, before training; the model
    is checked when training begins. The final weights are analysed at the end of
    training (``final=False`` turns it off). ``on_save=True`` also analyses each
    checkpoint the trainer writes, from its files (with ``every=None``, only those).
    ``schedules``: :class:`~diffract_training.TempBalance` and the others, built without
    model and optimizer; the trainer's are handed to them when training begins, and the
    optimizer's groups given back when it ends."""

    def __init__(self, trainer: Any = None, *, on_save: bool = False,
                 schedules: Sequence[Any] = (), **monitor: Any) -> None:
        self.trainer = trainer
        self.on_save_analysis = on_save
        self.schedules = check_schedules("DiffractCallback", schedules)
        self._options = monitor_options("DiffractCallback", monitor, Monitor)
        self.monitor = self._new_monitor()
        self._args: Any = None
        self._state: Any = None
        self._control: Any = None
        self._callbacks: list[Any] = []  # the trainer's, which receive the values

    def _new_monitor(self) -> Monitor:
        monitor = Monitor(None, **self._options)  # log= takes one sink or a list
        monitor.role = (f"DiffractCallback(schedules="  # the ranks compare it at attach
                        f"{[type(s).__name__ for s in self.schedules]})")
        monitor._sinks.insert(0, self._to_trainer)
        return monitor

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        self._args, self._state, self._control = args, state, control
        if self.monitor.closed:  # a second train(): the first closed its monitor
            self.monitor = self._new_monitor()
        handler = _calling_handler()
        if handler is not None:
            self._callbacks = handler.callbacks
            if self._callbacks and self._callbacks[0] is not self:  # our end first (moving
                self._callbacks.remove(self)  # one back to the front leaves the handler's
                self._callbacks.insert(0, self)  # running loop over the rest as it was)
        elif self.trainer is not None:
            self._callbacks = self.trainer.callback_handler.callbacks
        elif [r for r in (args.report_to or []) if r != "none"]:
            raise InvalidArgumentError(
                "DiffractCallback was called by no Trainer's callback handler, so its values "
                f"cannot reach report_to={args.report_to}: add it with "
                "trainer.add_callback(DiffractCallback(trainer, ...)).")
        try:
            if model is not None:  # on every rank: the monitor knows which one writes
                self.monitor.attach(model)
            for schedule in self.schedules:  # the trainer's optimizer exists by now
                schedule.attach(model, kwargs.get("optimizer"), state.global_step)
            if self.schedules and state.global_step > 0:  # a resumed run
                self._restore(args, state)
        except BaseException:  # training will not start: no thread left, groups given back
            self.on_train_end(args, state, control)
            raise

    def _restore(self, args: Any, state: Any) -> None:
        """The schedules' state saved in the checkpoint this run resumes from (found as
        the trainer was given it, else ``checkpoint-<step>`` in the output folder)."""
        folder = _resumed_from() or Path(args.output_dir) / \
            f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        path = Path(folder) / SCHEDULES_FILE
        saved: Any = None
        if path.is_file():
            try:
                saved = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise InvalidArgumentError(
                    f"DiffractCallback: {str(path)!r} cannot be read ({exc}): the schedules' "
                    "state of the resumed run; remove it to start them over.") from None
        if not restore_states("DiffractCallback", self.schedules, saved, repr(str(path))):
            log.warning("diffract: resumed at step %d without %s in %s: the schedules start "
                        "over from the resumed weights", state.global_step, SCHEDULES_FILE,
                        folder)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._args, self._state, self._control = args, state, control
        self.monitor.step(state.global_step)
        for schedule in self.schedules:
            schedule.step(state.global_step)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """With ``on_save=True``: the checkpoint just written (``checkpoint-<step>`` in
        the output folder), from its files, in the background, unless that step was
        analysed live already."""
        self._args, self._state, self._control = args, state, control
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if self.schedules and folder.is_dir() and state.is_world_process_zero:
            part = folder / f".{SCHEDULES_FILE}.part"  # whole or absent, as the trainer's
            part.write_text(json.dumps(saved_states(self.schedules)))
            part.replace(folder / SCHEDULES_FILE)
        if self.on_save_analysis and folder.is_dir():
            self.monitor.analyse_saved(folder, state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._args, self._state, self._control = args, state, control
        try:
            self.monitor.close()
        finally:
            for schedule in reversed(self.schedules):  # the last split first
                schedule.close()

    def _to_trainer(self, values: dict[str, float], spectra: dict[str, Any], step: int,
                    monitor: Monitor) -> None:
        """The values to the trainer's other callbacks' ``on_log`` at ``step`` (not the
        console ones: hundreds of per-layer values), the ESDs to its TensorBoard writer."""
        if not self._callbacks or self._state is None:
            return
        at = copy.copy(self._state)
        at.global_step = step
        for callback in list(self._callbacks):
            if callback is self or isinstance(callback, (ProgressCallback, PrinterCallback)):
                continue
            callback.on_log(self._args, at, self._control, logs=dict(values))
            writer = getattr(callback, "tb_writer", None)
            if writer is not None:
                write_histograms(writer, spectra, step, monitor)
                writer.flush()


def _resumed_from() -> str | None:
    """The checkpoint folder the calling Trainer resumes from (its training loop's
    ``resume_from_checkpoint``), or None."""
    import sys

    from transformers import Trainer

    frame = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            return None
        found = frame.f_locals.get("resume_from_checkpoint")
        if isinstance(frame.f_locals.get("self"), Trainer) and isinstance(found, (str, Path)):
            return str(found)
        frame = frame.f_back
    return None


def _calling_handler() -> Any:
    """The transformers ``CallbackHandler`` whose ``call_event`` is calling this
    callback's event (two frames up: the event, then the handler's loop), or None."""
    import sys

    from transformers.trainer_callback import CallbackHandler

    frame = sys._getframe(2)
    for _ in range(3):  # the handler's loop, or a wrapper just around it
        owner = frame.f_locals.get("self") if frame is not None else None
        if isinstance(owner, CallbackHandler):
            return owner
        frame = frame.f_back if frame is not None else None
    return None
