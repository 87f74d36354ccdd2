"""Each use of Lightning's private state (`minigpt.training.lightning_internals`) on a real, small
Trainer: these fail when a new Lightning changes what a function relies on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import Logger

from minigpt.training.lightning_internals import (
    PROCESS_OBSERVER,
    attached_trainer,
    carry_step_count,
    expect_ranks_to_stop,
    gradients_kept_local,
    help_showing,
    hooks_reach_listeners_only,
    keep_stopped_epoch_open,
    logged_values_stay_put,
    logging_step,
    optimize_manually,
    save_last_checkpoint,
    set_logging_step,
    step_logs_kept,
)


def make_trainer(tmp_path: Path, **settings: Any) -> L.Trainer:
    """A CPU Trainer over BoringModel's data: 10 batches an epoch, no validation, nothing printed."""
    defaults = dict(
        default_root_dir=tmp_path,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_train_batches=10,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        max_steps=4,
    )
    return L.Trainer(**{**defaults, **settings})


class StepsLogged(Logger):
    """The steps of the rows the loggers receive with a value of "x"."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []

    @property
    def name(self) -> str:
        return "steps"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "x" in metrics:
            self.steps.append(step)


class LogsEveryStep(BoringModel):
    """Logs "x" at every training step, recording what the internals say there; with `offset`,
    moves the step Lightning logs under by that much as each batch starts."""

    def __init__(self, offset: int = 0) -> None:
        super().__init__()
        self.offset = offset
        self.seen: list[tuple[int, int, bool]] = []
        """(global_step, logging_step, step_logs_kept) at each training step."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.offset:
            set_logging_step(self.trainer, self.trainer.global_step + self.offset)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        trainer = self.trainer
        self.seen.append((trainer.global_step, logging_step(trainer), step_logs_kept(trainer)))
        self.log("x", float(batch_idx))
        return super().training_step(batch, batch_idx)


def test_attached_trainer_is_the_modules_trainer_or_none(tmp_path: Path) -> None:
    model = BoringModel()
    assert attached_trainer(model) is None
    with pytest.raises(RuntimeError, match="not attached"):
        model.trainer  # noqa: B018 (what attached_trainer spares its callers)
    trainer = make_trainer(tmp_path, max_steps=1)
    trainer.fit(model)
    assert attached_trainer(model) is trainer


def test_logging_step_counts_optimizer_steps_and_step_logs_kept_says_which_reach_the_loggers(
    tmp_path: Path,
) -> None:
    model, logger = LogsEveryStep(), StepsLogged()
    # 14 steps over two epochs of 10 batches: the count runs on across the epoch's end.
    make_trainer(tmp_path, logger=logger, log_every_n_steps=3, max_steps=14).fit(model)
    assert [counted for _, counted, _ in model.seen] == list(range(14))
    assert [counted for step, counted, _ in model.seen] == [step for step, _, _ in model.seen]
    kept = [counted for _, counted, is_kept in model.seen if is_kept]
    assert kept == [2, 5, 8, 11]  # every third step
    # A kept step's values reach the loggers under its count; the others' never do.
    assert logger.steps == kept


def test_set_logging_step_moves_the_step_values_are_logged_under(tmp_path: Path) -> None:
    plain, moved = StepsLogged(), StepsLogged()
    make_trainer(tmp_path / "plain", logger=plain, log_every_n_steps=2, max_steps=6).fit(LogsEveryStep())
    model = LogsEveryStep(offset=100)
    make_trainer(tmp_path / "moved", logger=moved, log_every_n_steps=2, max_steps=6).fit(model)
    assert [counted for _, counted, _ in model.seen] == [100 + step for step in range(6)]
    assert plain.steps and moved.steps == [100 + step for step in plain.steps]


class RecordsBatches(BoringModel):
    """Records (epoch, batch index) of every training batch; with `keep_open`, its checkpoints
    keep an epoch that max_steps stopped open."""

    def __init__(self, keep_open: bool) -> None:
        super().__init__()
        self.keep_open = keep_open
        self.batches: list[tuple[int, int]] = []

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.batches.append((self.current_epoch, batch_idx))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.keep_open:
            keep_stopped_epoch_open(self.trainer, checkpoint)


class SaveAtEnd(L.Callback):
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trainer.save_checkpoint(self.path)


@pytest.mark.parametrize(
    ("keep_open", "resumed_at"),
    # Without it, Lightning books the stopped epoch as finished and goes on in the next one, whose
    # sampler deals other batches: when that fails, a new Lightning may resume mid-epoch on its
    # own, and the function can go.
    [(True, [(0, 4), (0, 5)]), (False, [(1, 4), (1, 5)])],
    ids=["kept open", "Lightning alone"],
)
def test_a_run_stopped_mid_epoch_resumes_with_the_next_batch(
    tmp_path: Path, keep_open: bool, resumed_at: list[tuple[int, int]]
) -> None:
    path = tmp_path / "stopped.ckpt"
    first = RecordsBatches(keep_open)
    make_trainer(tmp_path, max_steps=4, callbacks=[SaveAtEnd(path)]).fit(first)
    assert first.batches == [(0, 0), (0, 1), (0, 2), (0, 3)]
    fit_loop = torch.load(path, weights_only=True)["loops"]["fit_loop"]
    assert set(fit_loop["epoch_progress"]) >= {"total", "current"}
    assert set(fit_loop["epoch_progress"]["current"]) >= {"started", "processed", "completed"}
    resumed = RecordsBatches(keep_open)
    make_trainer(tmp_path, max_steps=6).fit(resumed, ckpt_path=path)
    assert resumed.batches == resumed_at


class SavesLastAtEnd(L.Callback):
    """Calls save_last_checkpoint twice as training ends, recording what it answered."""

    def __init__(self, checkpoint: ModelCheckpoint) -> None:
        self.checkpoint = checkpoint
        self.answers: list[bool] = []

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.answers += [save_last_checkpoint(self.checkpoint, trainer) for _ in range(2)]


def test_save_last_checkpoint_writes_the_current_step_once(tmp_path: Path) -> None:
    # Lightning's ModelCheckpoint writes last.ckpt at step 2 and, having written one, not at the end.
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True, every_n_train_steps=2)
    probe = SavesLastAtEnd(checkpoint)
    trainer = make_trainer(tmp_path, max_steps=3, enable_checkpointing=True, callbacks=[checkpoint, probe])
    trainer.fit(BoringModel())
    assert probe.answers == [True, False]  # the second finds this step saved
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 3


def test_save_last_checkpoint_writes_nothing_in_a_fast_dev_run(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True)
    probe = SavesLastAtEnd(checkpoint)  # not among the callbacks: Lightning's own would save at the end
    make_trainer(tmp_path, fast_dev_run=2, callbacks=[probe]).fit(BoringModel())
    assert probe.answers == [False, False]
    assert not (tmp_path / "checkpoints").exists()


def test_help_showing_leaves_out_a_group_and_puts_the_parser_back() -> None:
    parser = LightningArgumentParser(prog="prog")
    ours = parser.add_argument_group("ours", description="OUR GROUP")
    ours.add_argument("--ours.a", type=int, default=1, help="our setting")
    theirs = parser.add_argument_group("theirs", description="THEIR GROUP")
    theirs.add_argument("--theirs.b", type=int, default=2, help="their setting")
    before = parser.format_help()
    with help_showing(parser, lambda action: not action.dest.startswith("theirs")):
        shown = parser.format_help()
    assert "--ours.a" in shown and "OUR GROUP" in shown and "--help" in shown
    assert "--theirs.b" not in shown and "THEIR GROUP" not in shown and "their setting" not in shown
    assert parser.format_help() == before
    assert "THEIR GROUP" in before and "their setting" in before


def test_the_process_observer_kills_everyone_for_a_rank_that_stopped_until_told_to_expect_it() -> None:
    import subprocess

    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    def observed() -> tuple[Any, subprocess.Popen, subprocess.Popen]:
        stopped = subprocess.Popen(["sh", "-c", "exit 143"])
        stopped.wait()
        # Stands in for rank 0, the launching process, which the observer kills with the ranks.
        launcher = subprocess.Popen(["sleep", "60"])
        return _ChildProcessObserver(main_pid=launcher.pid, child_processes=[stopped]), stopped, launcher

    observer, _, launcher = observed()
    assert observer.name == PROCESS_OBSERVER
    assert observer._run() is True  # a rank exited with 143: Lightning kills the launcher
    assert launcher.wait(timeout=10) == -9

    observer, _, launcher = observed()
    expect_ranks_to_stop([observer])
    try:
        assert observer._run() is True
        assert launcher.poll() is None  # left running
    finally:
        launcher.kill()
        launcher.wait()


class StepsItself(BoringModel):
    """Takes the optimizer's step itself every `trainer.accumulate_grad_batches` batches
    (`optimize_manually`), carrying an automatic checkpoint's step count over as it loads one."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def setup(self, stage: str) -> None:
        optimize_manually(self)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.batches += 1
        optimizer, accumulated = self.optimizers(), self.trainer.accumulate_grad_batches
        with gradients_kept_local(self.trainer, (batch_idx + 1) % accumulated != 0):
            self.manual_backward(self.step(batch) / accumulated)
        if (batch_idx + 1) % accumulated == 0:
            optimizer.step()
            optimizer.zero_grad()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        carry_step_count(checkpoint, manual=True)


def test_optimize_manually_comes_after_lightnings_check_and_keeps_the_trainers_accumulation(
    tmp_path: Path,
) -> None:
    model = StepsItself()
    trainer = make_trainer(tmp_path, accumulate_grad_batches=2, max_steps=3)
    trainer.fit(model)  # Lightning refuses accumulation with manual optimization before setup
    assert not model.automatic_optimization
    assert (trainer.global_step, model.batches) == (3, 6)  # optimizer steps, and two batches each


def test_carry_step_count_resumes_an_automatic_checkpoint_at_its_step_under_manual_optimization(
    tmp_path: Path,
) -> None:
    automatic = make_trainer(tmp_path, max_steps=3)
    automatic.fit(BoringModel())
    automatic.save_checkpoint(tmp_path / "automatic.ckpt")
    model = StepsItself()
    trainer = make_trainer(tmp_path, max_steps=5)
    trainer.fit(model, ckpt_path=tmp_path / "automatic.ckpt")
    assert (trainer.global_step, model.batches) == (5, 2)  # on from step 3, not from 0
    # A checkpoint that counted its steps under manual optimization is left as it is.
    trainer.save_checkpoint(tmp_path / "manual.ckpt")
    checkpoint = torch.load(tmp_path / "manual.ckpt", weights_only=True)
    before = repr(checkpoint["loops"])
    carry_step_count(checkpoint, manual=True)
    assert repr(checkpoint["loops"]) == before


def test_logged_values_stay_put_skips_the_walk_and_keeps_every_value(tmp_path: Path, monkeypatch) -> None:
    from lightning.pytorch.trainer.connectors.logger_connector import result

    logged_values_stay_put()
    logged_values_stay_put()  # once is enough: a second call wraps nothing again
    walks = []
    walk = result.apply_to_collection
    monkeypatch.setattr(result, "apply_to_collection", lambda *a, **k: walks.append(1) or walk(*a, **k))

    class Logs(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("step_value", float(batch_idx))  # on_step only
            self.log("epoch_mean", torch.tensor(float(batch_idx)), on_step=False, on_epoch=True)
            return super().training_step(batch, batch_idx)

    trainer = make_trainer(tmp_path, max_steps=4)
    trainer.fit(Logs())
    assert trainer.callback_metrics["step_value"] == 3.0
    assert trainer.callback_metrics["epoch_mean"] == 1.5  # the mean of 0, 1, 2 and 3
    # Only each store's first `to` walks it (two names), not each of the eight calls.
    assert len(walks) <= 2 + 2


def test_a_logged_store_on_another_device_still_moves() -> None:
    from lightning.pytorch.trainer.connectors.logger_connector.result import _Metadata, _ResultMetric

    logged_values_stay_put()
    store = _ResultMetric(_Metadata(fx="training_step", name="x", on_step=False, on_epoch=True), True)
    store.to(torch.device("cpu"))  # where it is: nothing to do
    store.to(torch.device("meta"))  # this machine's other device: every state goes
    assert store.value.device.type == store.cumulated_batch_size.device.type == "meta"


def test_hooks_reach_listeners_only_calls_what_callbacks_define(tmp_path: Path, monkeypatch) -> None:
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.profilers import SimpleProfiler

    from minigpt.training.profiler import QuietProfiler

    hooks_reach_listeners_only(QuietProfiler)
    hooks_reach_listeners_only(QuietProfiler)  # once is enough
    empty = []  # Callback's own empty hook, which a callback that does not define it inherits
    monkeypatch.setattr(Callback, "on_before_backward", lambda *a, **k: empty.append(1))

    class Listens(Callback):
        def __init__(self) -> None:
            self.calls: list[tuple[str, int, str]] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.calls.append(("end", batch_idx, pl_module._current_fx_name))

    listens, silent = Listens(), Callback()
    silent.on_train_batch_start = lambda trainer, module, batch, i: listens.calls.append(("start", i, ""))
    trainer = make_trainer(tmp_path, max_steps=3, callbacks=[listens, silent], profiler=QuietProfiler())
    trainer.fit(BoringModel())
    expected = [(("start", i, ""), ("end", i, "on_train_batch_end")) for i in range(3)]
    assert listens.calls == [call for pair in expected for call in pair]
    assert not empty  # no callback defines on_before_backward: nothing is called

    # A profiler that records gets Lightning's own calls, each hook of each callback profiled.
    profiler = SimpleProfiler()
    trainer = make_trainer(tmp_path, max_steps=2, callbacks=[Listens()], profiler=profiler)
    trainer.fit(BoringModel())
    assert len(empty) == 2
    assert any(name.endswith("Listens.on_train_batch_end") for name in profiler.recorded_durations)
