"""The global batch in tokens, from which gradient accumulation follows.

`tokens_per_step` is what one optimizer step sees over every process. With the micro-batch (the
ids one process reads at a time, as its data module counts them: `batch_size` windows of
`context_length` tokens, two windows a pair for preference data) and the number of processes
(devices x nodes), it fixes `accumulate_grad_batches`, so one config means the same optimisation
on one device or sixty-four: only the accumulation changes.
"""

from __future__ import annotations

import lightning as L

from minigpt.common import UsageError


def accumulation_for(tokens_per_step: int, micro_batch: tuple[int, str], world_size: int) -> int:
    """The `accumulate_grad_batches` that makes one optimizer step `tokens_per_step` tokens, where
    one process reads `micro_batch` at a time: its tokens, and what they are (the data module's
    `micro_batch()`).

    Raises:
        UsageError: `tokens_per_step` is not a whole number of passes of every process, naming the
            nearest values that are.
    """
    tokens, batch = micro_batch
    per_pass = tokens * world_size
    if tokens_per_step < 1:
        raise UsageError(f"tokens_per_step must be positive, got {tokens_per_step}")
    if tokens_per_step % per_pass:
        below = tokens_per_step // per_pass * per_pass
        above = below + per_pass
        near = f"{below:,} or {above:,}" if below else f"{above:,} (or a smaller batch)"
        raise UsageError(
            f"tokens_per_step {tokens_per_step:,} is not a multiple of the {per_pass:,} tokens one pass of "
            f"every process reads ({batch} x {world_size} {_processes(world_size)}): {near} would work"
        )
    return tokens_per_step // per_pass


def apply_tokens_per_step(trainer: L.Trainer, tokens_per_step: int, micro_batch: tuple[int, str]) -> None:
    """Set `trainer.accumulate_grad_batches` from `tokens_per_step`, as Lightning's own
    GradientAccumulationScheduler sets it; the trainer knows its world size from the moment it is
    built (devices x num_nodes, or what torchrun or SLURM say).

    An accumulation the config also sets is accepted only where it agrees: Lightning's default of 1
    means "not set". Lightning counts an int `val_check_interval` in batches, not optimizer steps;
    it is scaled by the accumulation, so validation falls on the same steps on any number of devices.
    """
    world_size = trainer.world_size
    accumulate = accumulation_for(tokens_per_step, micro_batch, world_size)
    given = trainer.accumulate_grad_batches
    if given not in (1, accumulate):
        raise UsageError(
            f"trainer.accumulate_grad_batches {given} disagrees with tokens_per_step {tokens_per_step:,}, "
            f"which needs {accumulate} at {micro_batch[1]} on {world_size} {_processes(world_size)}: "
            "set only one of them"
        )
    trainer.accumulate_grad_batches = accumulate
    if isinstance(trainer.val_check_interval, int):
        trainer.val_check_interval *= accumulate


def planned_accumulation(
    tokens_per_step: int, micro_batch: tuple[int, str], devices: object, num_nodes: int
) -> str:
    """One line for `--print_config`: the accumulation `tokens_per_step` will give, where the
    number of processes can be read from the config alone."""
    count = _device_count(devices)
    if count is None:
        return (
            f"tokens_per_step {tokens_per_step:,}: accumulate_grad_batches follows from the number of "
            f"processes, known at start (devices {devices!r}); the run summary prints it"
        )
    world_size = count * num_nodes
    try:
        accumulate = accumulation_for(tokens_per_step, micro_batch, world_size)
    except UsageError as err:
        return f"error: {err}"
    return (
        f"tokens_per_step {tokens_per_step:,} = {micro_batch[1]} x {world_size} {_processes(world_size)} "
        f"x accumulate_grad_batches {accumulate} (set at start)"
    )


def _device_count(devices: object) -> int | None:
    """How many processes per node `trainer.devices` asks for, where the value alone says."""
    if isinstance(devices, list | tuple):
        return len(devices)
    text = str(devices).strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    if "," in text:
        return len([d for d in text.split(",") if d.strip()])
    return None  # "auto", -1: the machine decides


def _processes(n: int) -> str:
    return "process" if n == 1 else "processes"
