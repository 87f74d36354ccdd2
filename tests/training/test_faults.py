"""Runs that crash, are interrupted or diverge lose nothing that was saved."""

from __future__ import annotations

import math
import signal
from pathlib import Path

import pytest
import torch

from .conftest import REPO, run_script, tiny_args

pytestmark = pytest.mark.slow

FAULTS = "tests.training.faults"
ENV = {"PYTHONPATH": str(REPO)}


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_saves_a_checkpoint_and_exits_cleanly(corpus: Path, tmp_path: Path, signum: int) -> None:
    args = tiny_args(
        corpus,
        tmp_path / "run",
        f"--trainer.callbacks+={FAULTS}.SignalAt",
        "--trainer.callbacks.step=7",
        f"--trainer.callbacks.signum={int(signum)}",
    )
    result = run_script("train.py", *args, cwd=tmp_path, env=ENV)
    assert result.returncode == 128 + signum, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert f"stopped by {signal.Signals(signum).name}: saved step 8" in result.stderr
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 8  # the step in progress was finished, then saved


def test_divergence_stops_with_the_step_and_keeps_the_last_good_checkpoint(
    corpus: Path, tmp_path: Path
) -> None:
    # Validation at step 20 saves a good checkpoint; the weights are poisoned before step 25.
    args = tiny_args(
        corpus,
        tmp_path / "run",
        f"--trainer.callbacks+={FAULTS}.PoisonWeights",
        "--trainer.callbacks.step=25",
    )
    result = run_script("train.py", *args, cwd=tmp_path, env=ENV)
    assert result.returncode == 1
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: training diverged: the loss became nan at step 25")
    assert "last good checkpoint" in last_line
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 20
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())


def test_resume_after_sigkill_reproduces_the_uninterrupted_run(corpus: Path, tmp_path: Path) -> None:
    # With dropout, every step draws from torch's random generator: the resumed run matches only
    # if the checkpoint carried the generator's state and nothing else drew from it since.
    dropout = ["--model.gpt.dropout", "0.1"]
    straight = run_script(
        "train.py", *tiny_args(corpus, tmp_path / "straight", *dropout), cwd=tmp_path, env=ENV
    )
    assert straight.returncode == 0, straight.stderr[-2000:]

    crash_args = [*dropout, f"--trainer.callbacks+={FAULTS}.SignalAt", "--trainer.callbacks.step=27"]
    crashed = run_script(
        "train.py", *tiny_args(corpus, tmp_path / "crashed", *crash_args), cwd=tmp_path, env=ENV
    )
    assert crashed.returncode == -signal.SIGKILL
    assert (
        torch.load(tmp_path / "crashed" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 20
    )

    resumed = run_script(
        "train.py",
        *tiny_args(corpus, tmp_path / "crashed", *dropout, "--ckpt_path", "last"),
        cwd=tmp_path,
        env=ENV,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = weights(tmp_path / "straight" / "checkpoints" / "last.ckpt")
    b = weights(tmp_path / "crashed" / "checkpoints" / "last.ckpt")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    # The loss curves after the resume point agree too.
    losses = [_val_losses(tmp_path / name) for name in ("straight", "crashed")]
    assert losses[0][-1] == losses[1][-1] and math.isfinite(losses[0][-1])


def _val_losses(run: Path) -> list[float]:
    import csv

    rows = []
    for path in sorted(run.glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            rows += [float(r["val_loss"]) for r in csv.DictReader(f) if r.get("val_loss")]
    return rows


def test_resume_needs_something_to_resume(corpus: Path, tmp_path: Path) -> None:
    result = run_script("train.py", *tiny_args(corpus, tmp_path / "run", "--ckpt_path", "last"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: --ckpt_path last: there is no")


def test_resume_from_a_truncated_checkpoint_is_one_line(corpus: Path, tmp_path: Path) -> None:
    bad = tmp_path / "half.ckpt"
    bad.write_bytes(b"PK\x03\x04 not really")
    result = run_script(
        "train.py", *tiny_args(corpus, tmp_path / "run", "--ckpt_path", str(bad)), cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: cannot read checkpoint {bad}: truncated or not a PyTorch checkpoint"
    )
