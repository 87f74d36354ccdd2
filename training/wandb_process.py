"""What a run sets in wandb for its whole process before its wandb run starts: wandb's own console
lines off, and no import of W&B Launch where there is nothing of it to apply. Both are called by
`AutoWandbLogger` (`loggers.py`) on the rank that starts the run."""

from __future__ import annotations

import sys
from typing import Any


def quiet_wandb() -> None:
    """Turn wandb's informational lines off in this process, before its run starts: those it
    prints as a run starts (its version, the sync mode, where the run is) and as it ends (the
    history, the summary, how to sync). Its warnings and errors still show."""
    import wandb  # here: importing it costs ~0.5 s, which only a run with this logger pays

    # Settings of the process, not of wandb.init: its console lines follow these alone.
    wandb.setup(wandb.Settings(show_info=False))


LAUNCH_INPUTS = "wandb.sdk.launch.inputs.internal"
"""The module of W&B Launch's job inputs: only its own functions stage any (`StagedLaunchInputs`)."""


def launch_inputs_only_where_staged() -> None:
    """Make a starting wandb run look for W&B Launch's staged job inputs only where some can have
    been staged: once `LAUNCH_INPUTS` has been imported.

    As every run starts, wandb imports `LAUNCH_INPUTS` to apply the inputs its functions staged.
    That import brings in the rest of `wandb.sdk.launch` and wandb's public API, whose pydantic
    models read their classes' source for docstrings: slow in a process that holds torch and
    Lightning, and a visible part of train.py's start (docs/results/loop.md). Nothing else stages
    inputs, so until that module has been imported there are none, and wandb's step is skipped;
    after, wandb's own step runs. Relies on `wandb.sdk.wandb_run.Run._detect_and_apply_job_inputs`,
    which the run calls when it is ready. Installed once per process. Tested on wandb 0.31.0.
    """
    from wandb.sdk import wandb_run  # here: importing wandb costs ~0.5 s (see quiet_wandb)

    apply = wandb_run.Run._detect_and_apply_job_inputs
    if getattr(apply, "only_where_staged", False):
        return

    def apply_where_staged(run: Any) -> None:
        if LAUNCH_INPUTS in sys.modules:
            apply(run)

    apply_where_staged.only_where_staged = True  # type: ignore[attr-defined]
    apply_where_staged.wandb_step = apply  # type: ignore[attr-defined]
    wandb_run.Run._detect_and_apply_job_inputs = apply_where_staged  # type: ignore[method-assign]
