"""Loggers that write into the run folder, and a wandb logger that never prompts or hangs.

Loggers are declared in the YAML (`trainer.logger`, each with a `class_path`). A logger whose
`save_dir` is left null writes into the run folder (`trainer.default_root_dir`): `train.py`
fills it in before building the logger, so `--trainer.default_root_dir` moves the whole run.
Any other Lightning logger works too, with its `save_dir` written out.
"""

from __future__ import annotations

import csv
import logging
import netrc
import os
import socket
from argparse import Namespace
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.utilities import rank_zero_only

from minigpt.common import (
    UsageError,
    WriteError,
    appending,
    atomic_write,
    reporting_write_failures,
    safe_write,
)

from .lightning_internals import step_logs_kept
from .wandb_process import launch_inputs_only_where_staged, quiet_wandb

log = logging.getLogger("minigpt")

WandbMode = Literal["auto", "online", "offline", "disabled"]


def wandb_logged_in() -> bool:
    """True when wandb has credentials: WANDB_API_KEY, or a netrc entry for its host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_reachable(timeout: float = 3.0) -> bool:
    """Whether wandb's server answers a TCP connection, so an online run won't hang at start."""
    url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    host = url.split("://")[-1].split("/")[0]
    port = 80 if url.startswith("http://") else 443
    if ":" in host:
        host, port = host.rsplit(":", 1)[0], int(host.rsplit(":", 1)[1])
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def wandb_mode(mode: WandbMode) -> str:
    """The mode a run uses: `auto` defers to $WANDB_MODE, then picks online when logged in and the
    server answers, else offline.

    Raises:
        UsageError: $WANDB_MODE is not a mode, or online is asked for without credentials (wandb
            would otherwise stop and prompt for a key).
    """
    chosen = (os.environ.get("WANDB_MODE") or "auto") if mode == "auto" else mode
    if chosen == "dryrun":
        chosen = "offline"
    if chosen not in ("auto", "online", "offline", "disabled"):
        raise UsageError(f"WANDB_MODE={chosen!r} is not one of online, offline, disabled")
    if chosen == "auto":
        chosen = "online" if wandb_logged_in() else "offline"
        if chosen == "online" and not wandb_reachable():
            log.warning("wandb: logged in but its server is unreachable; logging offline (wandb sync later)")
            chosen = "offline"
    if chosen == "online" and not wandb_logged_in():
        raise UsageError(
            "wandb mode is online but no credentials were found: run `wandb login` or set WANDB_API_KEY"
        )
    return chosen


class AutoWandbLogger(LightningWandbLogger):
    """Lightning's `WandbLogger` with one more choice of `mode`: `auto`, the default.

    `auto` logs online when you are logged in (`wandb login` or WANDB_API_KEY) and wandb's server
    answers, and offline into the run folder otherwise (`wandb sync` uploads it later);
    $WANDB_MODE, when set, takes precedence, as in wandb itself (`WANDB_MODE=disabled` turns it
    off). The other arguments are `lightning.pytorch.loggers.WandbLogger`'s and `wandb.init`'s;
    `init` takes any `wandb.init` argument not listed.

    wandb's own banner is left out (`quiet_wandb`): the run's summary says in one line where the
    run goes (`summary_line`), and wandb's warnings and errors still show.
    """

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | Path | None = None,
        project: str | None = "minigpt",
        mode: WandbMode = "auto",
        version: str | None = None,
        log_model: bool | Literal["all"] = False,
        prefix: str = "",
        checkpoint_name: str | None = None,
        entity: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        notes: str | None = None,
        job_type: str | None = None,
        resume: str | None = None,
        init: dict[str, Any] | None = None,
    ) -> None:
        """
        Args:
            name: Run name shown in the dashboard (default: wandb's generated name).
            save_dir: Where the `wandb/` folder goes (null: the run folder).
            project: wandb project.
            mode: auto, online, offline or disabled (see the class docstring).
            version: The wandb run id, to resume a run (`resume`).
            log_model: true: checkpoints become wandb artifacts at the end; "all": as they are saved.
            prefix: Put before every metric's name.
            checkpoint_name: Name of the checkpoints' artifact (default: model-<run id>).
            entity: The wandb team or user the run goes to (default: your own).
            group: Groups runs on the dashboard (a sweep, a DDP pair).
            tags: Labels to filter runs by.
            notes: A longer description of the run.
            job_type: Another way to group runs (train, eval, ...).
            resume: wandb's resume mode for `version` ("allow", "must", "never").
            init: Any other `wandb.init` argument, by name.

        The arguments are written out rather than passed through as `**kwargs`, so that reading
        the signature (the command line, `--print_config`) imports neither wandb nor reads the
        source of Lightning's logger, and `--print_config` lists only these.
        """
        self.mode = wandb_mode(mode)
        self._wandb_dir: Path | None = None if self.mode == "disabled" else Path(save_dir or ".") / "wandb"
        kwargs = {
            key: value
            for key, value in dict(
                entity=entity, group=group, tags=tags, notes=notes, job_type=job_type, resume=resume
            ).items()
            if value is not None
        }
        kwargs.update(init or {})
        if self.mode == "disabled" and kwargs.get("settings") is None:
            # A disabled run records nothing, yet wandb still asks git about the run folder, which
            # does not exist yet, and prints "git root ... does not exist" at every start.
            import wandb  # here: importing it costs ~0.5 s, which only a run with this logger pays

            kwargs["settings"] = wandb.Settings(disable_git=True)
        super().__init__(
            name=name,
            save_dir=str(save_dir or "."),
            version=version,
            project=project,
            log_model=log_model,
            prefix=prefix,
            checkpoint_name=checkpoint_name,
            mode=self.mode,
            **kwargs,
        )
        if self._wandb_init.get("anonymous") is None:
            # Lightning passes anonymous=None along, which wandb answers with a deprecation warning.
            del self._wandb_init["anonymous"]

    @property
    def experiment(self) -> Any:
        # wandb writes into <save_dir>/wandb, which must exist; made here, when the run starts,
        # so that a command line refused before training leaves no folder behind.
        if self._wandb_dir is not None:
            self._wandb_dir.mkdir(parents=True, exist_ok=True)
            self._wandb_dir = None
            if rank_zero_only.rank == 0:  # the only rank that starts a wandb run
                quiet_wandb()
                launch_inputs_only_where_staged()
        return super().experiment

    def finalize(self, status: str) -> None:
        super().finalize(status)
        if self.mode == "disabled" or rank_zero_only.rank != 0:
            return
        import wandb  # imported already: the run started with the fit

        # Finished here, where its settings hold: a run left to finish as Python exits has
        # wandb's service print its sync advice, in colour codes even in a log file.
        if wandb.run is not None:
            wandb.finish(exit_code=0 if status == "success" else 1)

    def summary_line(self) -> str | None:
        """Where the run's wandb record goes, in one line for the run's summary; None when disabled."""
        if self.mode == "disabled":
            return None
        run = self.experiment
        if self.mode == "offline":
            folder = run.settings.sync_dir
            return f"wandb: offline, in {folder}; `wandb sync {folder}` uploads it"
        return f"wandb: online, {run.url}"


class SafeCSVLogger(LightningCSVLogger):
    """Lightning's `CSVLogger` (metrics.csv per run version), in the run folder by default, whose
    files a full disk or a folder made read-only never leaves half-written: such a failure raises
    WriteError (one line) and leaves each file as it was. Lightning appends rows to metrics.csv,
    rewrites it in place when a new metric widens its header, and rewrites hparams.yaml in place;
    here an append that fails is cut back, and the rewrites are atomic. Tested on Lightning 2.6.6.
    """

    def __init__(
        self,
        save_dir: str | Path | None = None,
        name: str | None = "csv",
        version: int | str | None = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        """
        Args:
            save_dir: Parent of the `name/version_N/` folders (null: the run folder).
            name: Folder for this logger's versions.
            version: The version folder (default: the next free `version_N`).
            prefix: Put before every metric's name.
            flush_logs_every_n_steps: How often the rows reach metrics.csv.
        """
        super().__init__(
            save_dir=save_dir or ".",
            name=name,
            version=version,
            prefix=prefix,
            flush_logs_every_n_steps=flush_logs_every_n_steps,
        )

    @property
    def experiment(self) -> Any:
        with reporting_write_failures(self.log_dir):  # its folders are made with it
            return super().experiment

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace | None = None) -> None:
        writer = self.experiment
        writer.hparams.update(vars(params) if isinstance(params, Namespace) else params or {})
        with safe_write(Path(writer.log_dir) / writer.NAME_HPARAMS_FILE) as tmp:
            save_hparams_to_yaml(tmp, writer.hparams)

    @rank_zero_only
    def save(self) -> None:
        writer = self.experiment
        path = Path(writer.metrics_file_path)
        try:
            with reporting_write_failures(path):
                new_keys = set().union(*writer.metrics) - set(writer.metrics_keys)
                if new_keys and path.is_file():  # widened here, so that Lightning only appends
                    keys = sorted([*writer.metrics_keys, *new_keys])
                    _rewrite_header(path, keys)
                    writer.metrics_keys[:] = keys
                with appending(path):
                    super().save()
        except WriteError:
            writer.metrics.clear()  # rows that cannot be written: finalize must not try them again
            raise


# The names these loggers had before, kept only so that an older run's config.yaml resolves.
CSVLogger, WandbLogger = SafeCSVLogger, AutoWandbLogger


def _rewrite_header(path: Path, keys: list[str]) -> None:
    """Rewrite the CSV at `path` under the header `keys`, whole or not at all."""
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    with atomic_write(path) as tmp, open(tmp, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def step_logs_written(trainer: Any) -> bool:
    """Whether values a training step logs now reach the loggers (Lightning keeps a step's values
    every `log_every_n_steps` steps and as it stops); each `self.log` costs its Python all the same
    (docs/results/step-costs.md), so per-step figures are logged only then. True without a trainer."""
    if trainer is None or trainer.fast_dev_run:
        return True
    return step_logs_kept(trainer)
