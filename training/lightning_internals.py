"""Every place the project reaches into Lightning's private state, one small function each.

Lightning has no public way to do what these do. Each function says what it relies on, why the
project needs it and the versions it was tested on; tests/training/test_lightning_internals.py
runs each on a real Trainer and fails when a new Lightning changes what it relies on. The rest of
the project calls these by name and never touches an underscored attribute of Lightning's.

Tested on Lightning 2.6.6 (with jsonargparse 4.53.0 and Python 3.11 for `help_showing`).
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, ParallelStrategy, SingleDeviceStrategy
from lightning.pytorch.trainer import call
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultMetric

# -- the trainer and its loops ------------------------------------------------------------------


def attached_trainer(module: L.LightningModule) -> L.Trainer | None:
    """The Trainer `module` is attached to; None for a module used on its own.

    Relies on `LightningModule._trainer`, the attribute behind `module.trainer` (which raises
    rather than answering None). Needed because a training step asks the trainer whether its logs
    are kept (`step_logs_kept`), and tests call the step without one. Tested on Lightning 2.6.6.
    """
    return module._trainer


def step_logs_kept(trainer: L.Trainer) -> bool:
    """Whether the values logged during this training step reach the loggers: Lightning writes a
    step's values every `log_every_n_steps` steps (and as it stops), and drops the others.

    Relies on `trainer._logger_connector.should_update_logs`, which counts steps by the fit loop's
    `_batches_that_stepped` (`logging_step`). Needed because each `self.log` call costs its Python
    whether or not its value is kept (docs/results/step-costs.md), so per-step figures are logged
    only on the steps that keep them. Tested on Lightning 2.6.6.
    """
    return bool(trainer._logger_connector.should_update_logs)


def logging_step(trainer: L.Trainer) -> int:
    """The step count Lightning logs the current training step's values under (the `step`
    column of a CSV log), from 0.

    Relies on the fit loop's `epoch_loop._batches_that_stepped`: optimizer steps taken, saved in
    and restored from checkpoints. Tested on Lightning 2.6.6.
    """
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def set_logging_step(trainer: L.Trainer, step: int) -> None:
    """Log the coming training step's values under `step` (`logging_step`).

    Needed because a checkpoint saved by the validation Lightning adds when a run is told to stop
    (SIGTERM, Ctrl-C, max_time) brings that count back one short of `global_step`, and the resumed
    run's curve would sit one step left of the first part's. Relies on `_batches_that_stepped`
    as `logging_step` does. Tested on Lightning 2.6.6.
    """
    trainer.fit_loop.epoch_loop._batches_that_stepped = step


def keep_stopped_epoch_open(trainer: L.Trainer, checkpoint: dict[str, Any]) -> None:
    """Record in `checkpoint` (being saved) an epoch that `max_steps` stopped part-way through as
    started but not finished, as a checkpoint saved between steps records it.

    Needed because Lightning ends that epoch in its books when `max_steps` stops it: the checkpoint
    would resume at the next epoch's first batch, skipping the rest of this one, and
    `--ckpt_path last` with a larger `max_steps` would not go on with the next batch. Relies on
    the fit loop's state in a checkpoint (`loops.fit_loop.epoch_progress`, whose `total` and
    `current` count epochs `started`, `processed` and `completed`) and on the epoch loop's
    `batch_progress.current.ready` (batches begun this epoch). Tested on Lightning 2.6.6.
    """
    fit = checkpoint.get("loops", {}).get("fit_loop")
    taken = trainer.fit_loop.epoch_loop.batch_progress.current.ready
    if fit is None or taken >= trainer.num_training_batches:
        return
    for counts in fit["epoch_progress"].values():  # "total" and "current"
        if counts["processed"] == counts["started"]:
            counts["processed"] = counts["completed"] = counts["started"] - 1


def optimize_manually(module: L.LightningModule) -> None:
    """Make `module`'s training step take the optimizer's step itself (manual optimization), with
    the trainer's `accumulate_grad_batches` as it is, where the strategy lets a step run its own
    backward pass: on one device and under DDP. Other strategies (FSDP, whose wrapped forward
    surrounds the whole training step) keep Lightning's automatic optimization.

    Called from the module's `setup`. Relies on `Trainer._run` checking the loop configuration
    (`_verify_loop_configurations`, which refuses `accumulate_grad_batches` other than 1 under
    manual optimization) before it calls the `setup` hooks, and on the epoch loop reading
    `automatic_optimization` at each batch. Needed because the step accumulates micro-batches
    itself (`LitGPT.training_step`), and the rest of the run (the logging step, the throughput,
    validation's intervals) keeps reading the accumulation from the trainer, where Lightning
    counts it too. Tested on Lightning 2.6.6.
    """
    strategy = module.trainer.strategy
    module.automatic_optimization = not isinstance(strategy, SingleDeviceStrategy | DDPStrategy)


def carry_step_count(checkpoint: dict[str, Any], manual: bool) -> None:
    """Give a checkpoint (being loaded) the optimizer steps it took under the other kind of
    optimization as the count of the kind this run takes: `manual` or automatic. Checkpoints from
    before the step was written out in `LitGPT.training_step`, and FSDP's, count automatically.

    Relies on the fit loop's state in a checkpoint: `epoch_loop.automatic_optimization.optim_progress`
    (its `optimizer.step` counts) and `epoch_loop.manual_optimization.optim_step_progress` (the
    same counts, `total` and `current`, `ready` and `completed`), the one `global_step` is read
    from depending on the kind. Needed because the other count reads 0: the resumed run would start
    its schedule and its `max_steps` over. Tested on Lightning 2.6.6.
    """
    fit = checkpoint.get("loops", {}).get("fit_loop")
    if fit is None:
        return
    automatic = fit.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer", {})
    counts = [automatic.get("step"), fit.get("epoch_loop.manual_optimization.optim_step_progress")]
    if None in counts:
        return
    source, target = counts if manual else counts[::-1]
    if target["total"]["completed"] or not source["total"]["completed"]:
        return
    for scope in ("total", "current"):
        target[scope] = {"ready": source[scope]["ready"], "completed": source[scope]["completed"]}


@contextmanager
def gradients_kept_local(trainer: L.Trainer, keep: bool) -> Iterator[None]:
    """Within it, with `keep`, a backward pass leaves each rank's gradients on that rank (DDP's
    `no_sync`): the micro-batches of a step before its last need no all-reduce.

    Relies on `ParallelStrategy.block_backward_sync`, as Lightning's automatic optimization does
    when it accumulates. Tested on Lightning 2.6.6.
    """
    strategy = trainer.strategy
    if keep and isinstance(strategy, ParallelStrategy):
        with strategy.block_backward_sync():
            yield
    else:
        yield


def logged_values_stay_put() -> None:
    """Make `self.log` leave a logged value's store alone when it is already on the value's device.

    Lightning keeps each name's logged values in a `_ResultMetric` and calls its `to(value.device)`
    at every `self.log`. That `to` walks every attribute of the metric, torchmetrics' bookkeeping
    included, through `apply_to_collection`, and costs several times the rest of the call whether
    or not anything moves (docs/results/loop.md). Relies on `_ResultMetric` (in Lightning's
    `logger_connector.result`), its `to`, `is_tensor`, `meta.is_mean_reduction` and the tensor
    states `value` and `cumulated_batch_size`. A store that holds a Metric, or any tensor of which
    is elsewhere, moves as before. Installed once per process. Tested on Lightning 2.6.6.
    """
    if getattr(_ResultMetric.to, "stays_put", False):
        return
    move = _ResultMetric.to

    def to(self: _ResultMetric, *args: Any, **kwargs: Any) -> _ResultMetric:
        device = args[0] if len(args) == 1 and not kwargs else None
        if self.is_tensor and isinstance(device, torch.device):
            states = [self.value, self.cumulated_batch_size] if self.meta.is_mean_reduction else [self.value]
            if all(state.device == device for state in states):
                return self
        return move(self, *args, **kwargs)

    to.stays_put = True  # type: ignore[attr-defined]
    _ResultMetric.to = to  # type: ignore[method-assign]


def hooks_reach_listeners_only(quiet: type) -> None:
    """Make the trainer call a callback's hook only where the callback defines it, when its
    profiler is a `quiet` one (records nothing).

    Lightning calls every hook of every callback at every step, most of them `Callback`'s own
    empty methods, and for each it formats the profiler's name for the call from the callback's
    `state_key` (ModelCheckpoint builds its key from its settings each time) whether or not the
    profiler records it. A training step calls five hooks (docs/results/loop.md). Left to
    Lightning: a profiler that records, and the calls that pick monitoring callbacks. Relies on
    `lightning.pytorch.trainer.call._call_callback_hooks`, which the loops call through the module,
    and on `LightningModule._current_fx_name`, which it sets around the calls as Lightning does.
    Installed once per process. Tested on Lightning 2.6.6.
    """
    original = call._call_callback_hooks
    if getattr(original, "listeners_only", False):
        return
    defined: dict[tuple[type, str], bool] = {}

    def listens(callback: Callback, hook: str) -> bool:
        kind = type(callback)
        if (kind, hook) not in defined:
            defined[kind, hook] = getattr(kind, hook, None) is not getattr(Callback, hook, None)
        return defined[kind, hook] or hook in vars(callback)

    def call_hooks(
        trainer: L.Trainer, hook: str, *args: Any, monitoring_callbacks: bool | None = None, **kwargs: Any
    ) -> None:
        if monitoring_callbacks is not None or not isinstance(trainer.profiler, quiet):
            original(trainer, hook, *args, monitoring_callbacks=monitoring_callbacks, **kwargs)
            return
        module = trainer.lightning_module
        if module is not None:
            previous, module._current_fx_name = module._current_fx_name, hook
        for callback in trainer.callbacks:
            if listens(callback, hook):
                getattr(callback, hook)(trainer, module, *args, **kwargs)
        if module is not None:
            module._current_fx_name = previous

    call_hooks.listeners_only = True  # type: ignore[attr-defined]
    call._call_callback_hooks = call_hooks


# -- callbacks ----------------------------------------------------------------------------------


def save_last_checkpoint(callback: ModelCheckpoint, trainer: L.Trainer) -> bool:
    """Write `callback`'s `last.ckpt` now, as ModelCheckpoint writes it beside each checkpoint it
    saves; False, writing nothing, where ModelCheckpoint skips saving (`fast_dev_run`, outside
    fitting, in the sanity check, or this step already saved).

    Relies on ModelCheckpoint's `_should_skip_saving_checkpoint`, `_monitor_candidates` and
    `_save_last_checkpoint`. Needed because at the end of a run ModelCheckpoint writes `last.ckpt`
    only when it never wrote one, so a run stopping between validations would leave it at the
    last validation. Tested on Lightning 2.6.6.
    """
    if callback._should_skip_saving_checkpoint(trainer):
        return False
    callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))
    return True


# -- the processes Lightning launches ------------------------------------------------------------

PROCESS_OBSERVER = "child-process-observer"
"""The name of the thread with which Lightning's launcher (rank 0) watches the ranks it started."""


def expect_ranks_to_stop(threads: Iterable[threading.Thread] | None = None) -> None:
    """Tell the thread that watches the ranks Lightning launched (`PROCESS_OBSERVER`, among
    `threads`; default: this process's) that they are about to exit on purpose, with a signal's
    exit status.

    Relies on `_ChildProcessObserver`'s `_run`, which it calls every 5 s: when a rank has exited
    with a non-zero status it kills every rank and the launching process itself with SIGKILL.
    Needed because a run that a signal stops (SaveAndStopOnSignal) ends every rank with
    128 + the signal: the other ranks exit at once, while rank 0 still writes the report and
    finishes the loggers, and was killed in the middle when that took longer than the observer's
    next look. Tested on Lightning 2.6.6.
    """
    for thread in threading.enumerate() if threads is None else threads:
        if thread.name == PROCESS_OBSERVER and hasattr(thread, "_run"):
            thread._run = lambda: True  # type: ignore[attr-defined]  # nothing to watch any more


# -- LightningCLI's parser ----------------------------------------------------------------------


@contextmanager
def help_showing(parser: argparse.ArgumentParser, shown: Callable[[argparse.Action], bool]) -> Iterator[None]:
    """Within it, `parser.format_help()` leaves out the arguments `shown` refuses and the groups
    left without one; `--help` itself always shows. The parser is as it was after.

    Relies on argparse's `_actions`, `_action_groups`, each group's `_group_actions` and
    `_HelpAction`, under LightningCLI's parser. Needed because train.py's `--help` leaves
    Lightning's ~700 lines of settings to `--help trainer`, and argparse has no public way to
    leave a group out (a group's description shows even when each of its arguments is hidden).
    Tested on Python 3.11, jsonargparse 4.53.0 and Lightning 2.6.6.
    """

    def keep(action: argparse.Action) -> bool:
        return isinstance(action, argparse._HelpAction) or shown(action)

    groups = parser._action_groups
    hidden = [(action, action.help) for action in parser._actions if not keep(action)]
    parser._action_groups = [g for g in groups if any(keep(a) for a in g._group_actions)]
    for action, _ in hidden:
        action.help = argparse.SUPPRESS
    try:
        yield
    finally:
        parser._action_groups = groups
        for action, help_text in hidden:
            action.help = help_text
