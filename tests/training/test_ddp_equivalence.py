"""One config, the same optimisation on one process or two: tokens_per_step fixes the global batch,
DDP (gloo, CPU) splits it over the ranks, and a stopped 2-process run resumes exactly.

The runs are conftest.py's, shared with test_logging_ddp.py: `two_processes` and `one_process`
train SAME_RUN; `with_dropout`, `stopped_with_dropout` and `resumed_with_dropout` train
WITH_DROPOUT."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
import torch

from minigpt.checkpoints import MODEL_KEY, load_model

from .conftest import Launch
from .test_train_generate import read_metrics

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5
"""Relative, for the two layouts' losses and weights: the same sums, added in another order
(a mean of two ranks' means against one mean of two micro-batches), differ by float32 rounding,
about 1e-7 here."""

WEIGHT_TOLERANCE = 1e-5
"""Absolute, for the weights after 8 steps (they are about 0.02 to 0.1): Adam divides each update by
the root of its running squared gradient, which magnifies those rounding differences where a
gradient is near zero; the largest measured was 2.5e-6, a thousandth of one step at lr 3e-3."""


def step_losses(records: Path) -> list[float]:
    return json.loads((records / "steps.json").read_text())


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def test_two_processes_follow_the_loss_curve_of_one(two_processes: Launch, one_process: Launch) -> None:
    assert (
        "global batch 1,024 tokens (micro-batch 8 x 64 tokens x 2 accumulated x 1 process)"
        in one_process.result.stderr
    )
    one, two = step_losses(one_process.records), step_losses(two_processes.records)
    assert len(one) == len(two) == 8
    assert two == pytest.approx(one, rel=TOLERANCE)
    assert one[-1] < one[0] - 0.4  # it learned: the curves are not flat by accident
    val = [
        [float(r["val_loss"]) for r in read_metrics(launched.run) if r.get("val_loss")]
        for launched in (one_process, two_processes)
    ]
    assert len(val[0]) == 2 and val[1] == pytest.approx(val[0], rel=TOLERANCE)
    # Bits per byte from the same sums over both ranks: ASCII characters, one byte each, no end-of-text.
    bpb = [
        [float(r["val_bpb"]) for r in read_metrics(launched.run) if r.get("val_bpb")]
        for launched in (one_process, two_processes)
    ]
    assert bpb[1] == pytest.approx(bpb[0], rel=TOLERANCE)
    assert bpb[0] == pytest.approx([v / math.log(2) for v in val[0]], rel=TOLERANCE)
    a, b = weights(one_process.run), weights(two_processes.run)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=TOLERANCE, atol=WEIGHT_TOLERANCE)


def test_two_processes_write_each_checkpoint_once_from_rank_0(two_processes: Launch) -> None:
    records = two_processes.records
    assert sorted(p.name for p in records.glob("saves-rank*.txt")) == ["saves-rank0.txt"]
    # Two validations, each saving the best and the last checkpoint, each once.
    saves = (records / "saves-rank0.txt").read_text().split()
    assert sorted(saves) == ["best.ckpt", "best.ckpt", "last.ckpt", "last.ckpt"]
    assert sorted(p.name for p in (two_processes.run / "checkpoints").iterdir()) == [
        "best.ckpt",
        "last.ckpt",
    ]
    assert len(list((two_processes.run / "csv").glob("version_*"))) == 1


def test_a_stopped_two_process_run_resumes_to_the_same_weights(
    with_dropout: Launch, stopped_with_dropout: Launch, resumed_with_dropout: Launch
) -> None:
    straight, stopped, resumed = with_dropout, stopped_with_dropout, resumed_with_dropout
    assert straight.result.returncode == 0, straight.result.stderr[-3000:]
    description = torch.load(straight.run / "checkpoints" / "last.ckpt", weights_only=True)[MODEL_KEY]
    assert description["gpt"]["dropout"] == 0.1
    # SIGTERM to rank 1 as the second step starts: both ranks finish it, save it and stop.
    assert stopped.result.returncode == 128 + signal.SIGTERM, stopped.result.stderr[-3000:]
    assert torch.load(stopped.run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2
    assert resumed.result.returncode == 0, resumed.result.stderr[-3000:]
    # Exactly: the same windows, the same dropout masks, the same reductions in the same order;
    # the optimizer's state, the data position and the random generator restored from the checkpoint.
    losses = step_losses(straight.records)
    assert len(losses) == 4
    assert step_losses(stopped.records) == losses[:2]
    assert step_losses(resumed.records) == losses[2:]
    after_resume = weights(resumed.run)
    for key, value in weights(straight.run).items():
        torch.testing.assert_close(after_resume[key], value, rtol=0, atol=0, msg=key)


def test_fsdp_on_two_cpu_processes_follows_ddp_and_writes_readable_shards(
    two_processes: Launch, fsdp_and_diverged: tuple[Launch, Launch]
) -> None:
    # Lightning's FSDPStrategy with gpt2-medium.yaml's settings, on CPU processes (FSDP_STRATEGY).
    # Weight decay stays on (tiny.yaml's 0.1): the optimizer picks the decayed parameters by their
    # module, so FSDP's flat 1-D shards are decayed as DDP's matrices are.
    sharded = fsdp_and_diverged[0]
    assert sharded.result.returncode == 0, sharded.result.stderr[-3000:]
    # Gradients clipped by their global norm (clipping is at work in these steps), as under DDP.
    assert step_losses(sharded.records) == pytest.approx(step_losses(two_processes.records), rel=TOLERANCE)
    assert sharded.result.stdout.count("--- sample at step 8 ---") == 1  # drawn from the gathered weights
    for name in ("best.ckpt", "last.ckpt"):  # one folder each, one shard per process
        assert sorted(p.name for p in (sharded.run / "checkpoints" / name).glob("*.distcp")) == [
            "__0_0.distcp",
            "__1_0.distcp",
        ]
    # One process reads the shards back: generate.py and export.py take the folder as they take a file.
    model, _ = load_model(sharded.run / "checkpoints" / "last.ckpt")
    ddp = weights(two_processes.run)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, ddp[f"model.{key}"], rtol=TOLERANCE, atol=WEIGHT_TOLERANCE)
