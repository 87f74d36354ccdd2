"""One config, the same optimisation on one process or two: tokens_per_step fixes the global batch,
DDP (gloo, CPU) splits it over the ranks, and a stopped 2-process run resumes exactly."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from minigpt.checkpoints import load_model

from .conftest import REPO, run_script, tiny_args
from .test_faults import FAULTS
from .test_train_generate import read_metrics

pytestmark = pytest.mark.slow

ENV = {"PYTHONPATH": str(REPO)}
PROBES = "tests.training.probes"

# One optimizer step is 1,024 tokens: 16 windows of 64. On two processes each reads 8 windows
# (accumulate_grad_batches 1); on one it reads 8 and 8 again (accumulate_grad_batches 2). The
# windows are the same either way: the epoch's random start positions are dealt to the ranks in
# turn, so rank 0 and rank 1 read between them the 16 windows one process reads in two batches.
# Validation reads 32 windows both ways: 2 batches of 8 per rank, or 4 on one process; it comes
# every 4 optimizer steps both ways (with tokens_per_step, val_check_interval counts steps).
SAME_RUN = ("--tokens_per_step", "1024", "--data.config.batch_size", "8", "--trainer.max_steps", "8")
SAME_RUN += ("--trainer.val_check_interval", "4", "--trainer.log_every_n_steps", "1")
# Weight decay stays on (tiny.yaml's 0.1): the optimizer picks the decayed parameters by their module,
# so FSDP's flat 1-D shards are decayed as DDP's matrices are.
ON_TWO = ("--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp")
ON_TWO += ("--trainer.limit_val_batches", "2")
ON_ONE = ("--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.limit_val_batches", "4")

TOLERANCE = 1e-5
"""Relative, for the two layouts' losses and weights: the same sums, added in another order
(a mean of two ranks' means against one mean of two micro-batches), differ by float32 rounding,
about 1e-7 here."""

WEIGHT_TOLERANCE = 1e-5
"""Absolute, for the weights after 8 steps (they are about 0.02 to 0.1): Adam divides each update by
the root of its running squared gradient, which magnifies those rounding differences where a
gradient is near zero; the largest measured was 2.5e-6, a thousandth of one step at lr 3e-3."""


def train(corpus: Path, run: Path, records: Path, *args: str):
    probes = [
        f"--trainer.callbacks+={PROBES}.RecordStepLoss",
        f"--trainer.callbacks.folder={records}",
        "--trainer.plugins",
        json.dumps([{"class_path": f"{PROBES}.RecordSaves", "init_args": {"folder": str(records)}}]),
    ]
    return run_script(
        "train.py", *tiny_args(corpus, run, *SAME_RUN, *args, *probes), cwd=run.parent, env=ENV, timeout=240
    )


def step_losses(records: Path) -> list[float]:
    return json.loads((records / "steps.json").read_text())


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def two_processes(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ddp")
    result = train(corpus, folder / "run", folder / "records", *ON_TWO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "global batch 1,024 tokens (micro-batch 8 x 64 tokens x 1 accumulated x 2 processes)" in result.stderr
    )
    return folder


def test_two_processes_follow_the_loss_curve_of_one(
    two_processes: Path, corpus: Path, tmp_path: Path
) -> None:
    result = train(corpus, tmp_path / "run", tmp_path / "records", *ON_ONE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "global batch 1,024 tokens (micro-batch 8 x 64 tokens x 2 accumulated x 1 process)" in result.stderr
    )

    one, two = step_losses(tmp_path / "records"), step_losses(two_processes / "records")
    assert len(one) == len(two) == 8
    assert two == pytest.approx(one, rel=TOLERANCE)
    assert one[-1] < one[0] - 0.4  # it learned: the curves are not flat by accident
    val = [
        [float(r["val_loss"]) for r in read_metrics(folder / "run") if r.get("val_loss")]
        for folder in (tmp_path, two_processes)
    ]
    assert len(val[0]) == 2 and val[1] == pytest.approx(val[0], rel=TOLERANCE)
    a, b = weights(tmp_path / "run"), weights(two_processes / "run")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=TOLERANCE, atol=WEIGHT_TOLERANCE)


def test_two_processes_write_each_checkpoint_once_from_rank_0(two_processes: Path) -> None:
    records = two_processes / "records"
    assert sorted(p.name for p in records.glob("saves-rank*.txt")) == ["saves-rank0.txt"]
    # Two validations, each saving the best and the last checkpoint, each once.
    saves = (records / "saves-rank0.txt").read_text().split()
    assert sorted(saves) == ["best.ckpt", "best.ckpt", "last.ckpt", "last.ckpt"]
    assert sorted(p.name for p in (two_processes / "run" / "checkpoints").iterdir()) == [
        "best.ckpt",
        "last.ckpt",
    ]
    assert len(list((two_processes / "run" / "csv").glob("version_*"))) == 1


def test_a_stopped_two_process_run_resumes_to_the_same_weights(
    two_processes: Path, corpus: Path, tmp_path: Path
) -> None:
    # SIGTERM to rank 1 during step 2: both ranks finish step 3, save it and stop.
    stop = (f"--trainer.callbacks+={FAULTS}.SignalAt", "--trainer.callbacks.step=2")
    stop += (f"--trainer.callbacks.signum={int(signal.SIGTERM)}", "--trainer.callbacks.rank=1")
    run = tmp_path / "run"
    stopped = train(corpus, run, tmp_path / "stopped", *ON_TWO, *stop)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3

    resumed = train(corpus, run, tmp_path / "resumed", *ON_TWO, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # Exactly: the same windows, the same reductions in the same order, the optimizer's state and
    # the data position restored from the checkpoint.
    assert step_losses(tmp_path / "resumed") == step_losses(two_processes / "records")[3:]
    straight, after_resume = weights(two_processes / "run"), weights(run)
    for key in straight:
        torch.testing.assert_close(after_resume[key], straight[key], rtol=0, atol=0, msg=key)


def test_fsdp_on_two_cpu_processes_follows_ddp_and_writes_readable_shards(
    two_processes: Path, corpus: Path, tmp_path: Path
) -> None:
    # Lightning's FSDPStrategy with gpt2-medium.yaml's settings, on CPU processes (see CPUFSDPStrategy).
    strategy = {
        "class_path": f"{PROBES}.CPUFSDPStrategy",
        "init_args": {
            "auto_wrap_policy": ["minigpt.model.gpt.Block"],
            "activation_checkpointing_policy": ["minigpt.model.gpt.Block"],
            "state_dict_type": "sharded",
        },
    }
    fsdp = ("--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.limit_val_batches", "2")
    fsdp += ("--trainer.strategy", json.dumps(strategy))
    run = tmp_path / "run"
    result = train(corpus, run, tmp_path / "records", *fsdp)
    assert result.returncode == 0, result.stderr[-3000:]
    # Gradients clipped by their global norm (clipping is at work in these steps), as under DDP.
    assert step_losses(tmp_path / "records") == pytest.approx(
        step_losses(two_processes / "records"), rel=TOLERANCE
    )
    assert result.stdout.count("--- sample at step 8 ---") == 1  # drawn from the gathered weights
    for name in ("best.ckpt", "last.ckpt"):  # one folder each, one shard per process
        assert sorted(p.name for p in (run / "checkpoints" / name).glob("*.distcp")) == [
            "__0_0.distcp",
            "__1_0.distcp",
        ]
    # One process reads the shards back: generate.py and export.py take the folder as they take a file.
    model, _ = load_model(run / "checkpoints" / "last.ckpt")
    ddp = weights(two_processes / "run")
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, ddp[f"model.{key}"], rtol=TOLERANCE, atol=WEIGHT_TOLERANCE)
