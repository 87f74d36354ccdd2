"""`train.py`: LightningCLI over `LitGPT` and `TextDataModule`, loggers and callbacks from the YAML."""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import lightning as L
from jsonargparse import set_parsing_settings
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger

from minigpt.checkpoints import CheckpointError, check_readable
from minigpt.checkpoints.sharded import is_sharded_checkpoint
from minigpt.common import WRITE_FAILURES, UsageError, WriteError, reporting_write_failures
from minigpt.data import TextDataModule
from minigpt.training.callbacks.checkpoints import CheckpointWriteError
from minigpt.training.callbacks.guards import DivergenceError, SaveAndStopOnSignal
from minigpt.training.lightning_internals import hooks_reach_listeners_only, logged_values_stay_put
from minigpt.training.lit import LitGPT
from minigpt.training.profiler import QuietProfiler

from .command import USER_ERRORS, report, resolve_config_args
from .train_cli import MiniGPTCLI
from .train_parser import TrainParser, help_topic

__all__ = ["MiniGPTCLI", "TrainParser", "build_cli", "help_topic", "train_main"]
"""What others import from here; the command line's parsing lives in `train_cli`."""

log = logging.getLogger("minigpt")


class SaveAndLogConfig(SaveConfigCallback):
    """Lightning's config.yaml beside the CSV metrics, and the full config in every other logger
    (the wandb run's config, TensorBoard's hparams)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        folder = Path(trainer.log_dir or trainer.default_root_dir)
        with reporting_write_failures(folder / self.config_filename):
            super().setup(trainer, pl_module, stage)

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        config = self.config.as_dict()
        for logger in trainer.loggers:
            if not isinstance(logger, CSVLogger):
                logger.log_hyperparams(config)


def check_output_dir(out_dir: Path, ckpt_path: str | None) -> str | None:
    """Refuse to start a new run on top of another run's checkpoints, or to resume from nothing.

    Returns the checkpoint to resume from: `ckpt_path` as given, except that `last` without a
    `last.ckpt` (a save that failed before it, such as a full disk) is the newest checkpoint there.
    """
    checkpoints = out_dir / "checkpoints"
    if ckpt_path is None and checkpoints.is_dir() and any(checkpoints.glob("*.ckpt")):
        raise UsageError(
            f"{out_dir} already holds a run: resume it with --ckpt_path last, "
            "or choose another --trainer.default_root_dir"
        )
    if ckpt_path == "last":
        last = checkpoints / "last.ckpt"
        if is_sharded_checkpoint(last):
            return ckpt_path
        if last.is_file():
            check_readable(last)
            return ckpt_path
        newest = newest_checkpoint(checkpoints)
        if newest is None:
            raise UsageError(f"--ckpt_path last: there is no {last} to resume from")
        log.info(f"--ckpt_path last: resuming from {newest}, the newest checkpoint there (no {last.name})")
        ckpt_path = str(newest)
    if ckpt_path is not None:
        path = Path(ckpt_path)
        if is_sharded_checkpoint(path):  # FSDP's folder of shards
            return ckpt_path
        if not path.is_file():
            raise CheckpointError(f"checkpoint not found: {ckpt_path}")
        check_readable(path)
    return ckpt_path


def newest_checkpoint(folder: Path) -> Path | None:
    """The newest checkpoint in `folder` by modification time, whatever its name (`last.ckpt`
    where two are as new); None if there is none. Each is complete: the atomic save renames only
    complete files into place."""
    found = [path for path in folder.glob("*.ckpt") if path.is_file() or is_sharded_checkpoint(path)]
    return max(found, key=lambda path: (path.stat().st_mtime_ns, path.name == "last.ckpt"), default=None)


def check_run_folder_writable(out_dir: Path) -> None:
    """Refuse a run folder the run may not write (a read-only place, another user's folder, a
    parent that cannot be created) before the run starts, rather than with a traceback from the
    middle of Lightning's setup."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as err:
        why = WRITE_FAILURES.get(err.errno or 0) or (err.strerror or str(err)).lower()
        # Name the parent that could not be created; a failure inside the run folder is the folder's.
        failed = Path(os.fsdecode(err.filename or out_dir)).absolute()
        where = "" if failed.is_relative_to(out_dir.absolute()) else f" at {failed}"
        raise UsageError(f"cannot write the run folder {out_dir}: {why}{where}") from None


def resume_advice(out_dir: Path, folder: Path) -> str:
    """What to resume from after a checkpoint in `folder` could not be written, and how."""
    newest = newest_checkpoint(folder)
    if newest is None:
        return "no checkpoint was written"
    checkpoints = out_dir / "checkpoints"
    last = checkpoints / "last.ckpt"
    # `--ckpt_path last` takes last.ckpt where there is one, else the newest (check_output_dir).
    in_run = folder.resolve() == checkpoints.resolve()
    how = "last" if in_run and (newest.name == last.name or not last.exists()) else newest
    return (
        f"the newest complete checkpoint is {newest}; once there is room or the folder is writable, "
        f"resume from it with the same command and --ckpt_path {how}"
    )


def build_cli(argv: Sequence[str], save_config: bool = True) -> MiniGPTCLI:
    """train.py's command line parsed into its trainer, model and data, without fitting; with
    `save_config`, the run writes its config as train.py's runs do."""
    return MiniGPTCLI(
        LitGPT,
        TextDataModule,
        run=False,
        args=resolve_config_args(list(argv)),
        seed_everything_default=1337,
        parser_class=TrainParser,
        parser_kwargs={"exit_on_error": False},
        save_config_callback=SaveAndLogConfig if save_config else None,
        save_config_kwargs={"overwrite": True},
    )


def wants_help(argv: Sequence[str]) -> bool:
    """Whether the command line asks for help (`-h`, `--help`, `--help=trainer`, `--data.help CLASS`)."""
    return any(arg in ("-h", "--help") or arg.startswith("--help=") or ".help" in arg for arg in argv)


def train_main(args: Sequence[str] | None = None) -> int:
    """Parse the command line, then fit. Returns the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda"):
        logging.getLogger(name).addFilter(_SaidElsewhere())
    # Two warnings every run would print from inside Lightning, about nothing the user can change:
    # its model summary cannot size bf16 weights, and its pytree helper uses an API torch deprecated.
    warnings.filterwarnings("ignore", message="Precision bf16-mixed is not supported by the model summary")
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # Logs are written every log_every_n_steps steps counted over the whole run, not per epoch:
    # an epoch shorter than that (tiny data) loses none, whatever this warning says.
    warnings.filterwarnings(
        "ignore", message=r"The number of training batches \(\d+\) is smaller than the logging interval"
    )
    logged_values_stay_put()  # every self.log call, in the steps and the callbacks
    hooks_reach_listeners_only(QuietProfiler)  # every callback hook, five a step
    argv = list(sys.argv[1:] if args is None else args)
    # The config dataclasses document each field in a docstring under it; show those in --help.
    # Reading them means reading every class's source (~0.4 s), which only --help uses.
    set_parsing_settings(docstring_parse_attribute_docstrings=wants_help(argv))
    try:
        with warnings.catch_warnings():
            # We hand LightningCLI the command line ourselves, after resolving config names.
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
            cli = build_cli(argv)
        out_dir = Path(cli.trainer.default_root_dir)
        ckpt_path = check_output_dir(out_dir, cli.config.ckpt_path)
        check_run_folder_writable(out_dir)
        if ckpt_path is not None:
            cli.model.init_from = None  # a resumed run takes its weights from the checkpoint
        try:
            cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path, weights_only=True)
        except SystemExit:
            if (code := _stopped_at_once(cli.trainer)) is None:
                raise
            return code
        except RuntimeError as err:
            if not _peer_gone(cli.trainer, err):
                raise
            # Another rank ended first (rank 0 on a failed save says why in its own line).
            print(
                f"error: rank {cli.trainer.global_rank} stopped: another process of the run ended",
                file=sys.stderr,
            )
            return 1
        except WriteError as err:  # mid-run: the checkpoints written before it stay
            if newest_checkpoint(out_dir / "checkpoints") is None:
                return report(err)
            print(f"error: {err}; {resume_advice(out_dir, out_dir / 'checkpoints')}", file=sys.stderr)
            return 1
    except USER_ERRORS as err:
        return report(err)
    except DivergenceError as err:
        if cli.trainer.is_global_zero:  # every rank raises it; one reports it
            last = Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
            kept = f"the last good checkpoint is {last}" if last.is_file() else "no checkpoint was written"
            print(f"error: training diverged: {err}; {kept}", file=sys.stderr)
        return 1
    except CheckpointWriteError as err:  # only the rank that saves raises it
        print(f"error: {err}; {resume_advice(out_dir, err.path.parent)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted before training started", file=sys.stderr)
        return 130
    stopper = next((c for c in cli.trainer.callbacks if isinstance(c, SaveAndStopOnSignal)), None)
    if stopper is not None and stopper.received is not None:
        if cli.trainer.is_global_zero:
            print(
                f"stopped by {signal.Signals(stopper.received).name}: saved step {stopper.saved_step} to "
                f"{stopper.path}; continue with the same command and --ckpt_path last",
                file=sys.stderr,
            )
        return 128 + stopper.received
    return 0


PEER_GONE = re.compile(r"Connection (closed|reset) by peer|remote worker|NCCL communicator was aborted")
"""What torch.distributed raises in a rank whose peer process has exited (gloo, NCCL)."""


def _peer_gone(trainer: L.Trainer, err: RuntimeError) -> bool:
    """Whether `err`, raised in a rank other than 0 of a run on several processes, says that
    another process of the run went away, rather than something of this rank's own."""
    return trainer.world_size > 1 and not trainer.is_global_zero and bool(PEER_GONE.search(str(err)))


def _stopped_at_once(trainer: L.Trainer) -> int | None:
    """The exit code of a run that a second signal stopped in mid-step; None for any other exit.

    SaveAndStopOnSignal turns a second SIGINT or SIGTERM into KeyboardInterrupt, which Lightning
    answers by shutting down and calling sys.exit(1), as if the run had failed.
    """
    stopper = next((c for c in trainer.callbacks if isinstance(c, SaveAndStopOnSignal)), None)
    if stopper is None or stopper.received is None or not trainer.interrupted:
        return None
    if trainer.is_global_zero:
        name = signal.Signals(stopper.received).name
        print(f"stopped at once by a second {name}: the step in progress was not saved", file=sys.stderr)
    return 128 + stopper.received


class _SaidElsewhere(logging.Filter):
    """Drops Lightning's lines about the devices and the precision, which the run's summary
    states (RunSummary), its suggestion to install its hosted logger, at every start, and its
    note that the run reached max_steps, which the closing `done:` line says."""

    UNSAID = re.compile(
        r"(GPU|TPU|HPU) available: |Using (16bit|bfloat16) Automatic Mixed Precision \(AMP\)$"
        r"|LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES: |.*litlogger"
        r"|`Trainer.fit` stopped: `max_steps=\d+` reached"
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return self.UNSAID.match(record.getMessage()) is None
