"""The pair of commands docs/distributed.md gives, one on two CPU processes (DDP, gloo) and one on
a single process, log the same figures: the global batch's train_loss at every step that logs,
and the validation loss and bits per byte over the same windows."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from .conftest import REPO, finish, start_script
from .helpers import read_metrics

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5
"""Relative: the same sums, added in another order on one process and on two."""

SHORT = ("--trainer.max_steps", "10", "--trainer.enable_progress_bar", "false")
"""10 steps, logged at steps 5 and 10; validation every 20 (tiny.yaml) comes once, at the end."""


def docs_pair() -> list[list[str]]:
    """The arguments of docs/distributed.md's two tiny.yaml commands, as written there."""
    lines = (REPO / "docs" / "distributed.md").read_text().splitlines()
    commands = [shlex.split(line, comments=True) for line in lines if line.startswith("python train.py")]
    pair = [command[2:] for command in commands if command[2:4] == ["--config", "tiny.yaml"]]
    assert len(pair) == 2 and "2" in pair[0] and "1" in pair[1], pair
    return pair


def logged(run: Path, name: str) -> dict[int, float]:
    return {int(row["step"]): float(row[name]) for row in read_metrics(run) if row.get(name)}


def test_the_documented_ddp_pair_logs_the_same_losses(corpus: Path, tmp_path: Path) -> None:
    runs = [tmp_path / "two", tmp_path / "one"]
    started = [
        start_script(
            "train.py",
            *args,
            "--data.config.source",
            str(corpus),
            "--trainer.default_root_dir",
            str(run),
            *SHORT,
            cwd=tmp_path,
        )
        for args, run in zip(docs_pair(), runs, strict=True)
    ]
    for process in started:
        result = finish(process)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "global batch 2,048 tokens" in result.stderr
    two, one = runs
    train = [logged(run, "train_loss") for run in (two, one)]
    assert sorted(train[1]) == [4, 9]
    assert train[0] == pytest.approx(train[1], rel=TOLERANCE)
    for name in ("val_loss", "val_bpb"):
        val = [logged(run, name) for run in (two, one)]
        assert sorted(val[1]) == [9]  # at the end, although the interval is 20 steps
        assert val[0] == pytest.approx(val[1], rel=TOLERANCE)
    for run in runs:
        assert (run / "checkpoints" / "best.ckpt").is_file()
