"""What a run prints, read as a log file: one summary before the first step, the samples at each
validation and one closing line, with nothing from wandb or Lightning that says nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, tiny_args


def train_into_a_file(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, str]:
    """train.py with `args`, its stdout and stderr into a file as `> log 2>&1` would, wandb
    offline and not logged in; the finished process and what the file holds."""
    console = tmp_path / "console.txt"
    env = {**os.environ, "WANDB_MODE": "offline", "NETRC": str(tmp_path / "no-netrc")}
    for name in ("WANDB_SILENT", "WANDB_QUIET", "WANDB_API_KEY"):
        env.pop(name, None)
    with console.open("w") as out:
        result = subprocess.run(
            [sys.executable, str(REPO / "train.py"), *args],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=240,
        )
    return result, console.read_text()


MOST_LINES = 40
"""tiny.yaml for 20 steps prints ~20: the summary, the one sample, the done line (and, once, the
data's preparation)."""


@pytest.mark.slow
def test_a_run_logged_to_a_file_prints_a_summary_samples_and_one_done_line(
    corpus: Path, tmp_path: Path
) -> None:
    result, text = train_into_a_file(
        tiny_args(corpus, tmp_path / "run", "--trainer.max_steps", "20"), tmp_path
    )
    assert result.returncode == 0, text[-3000:]
    assert "\x1b" not in text, "colour codes in a file"
    lines = text.splitlines()
    assert not [line for line in lines if re.match(r"(GPU|TPU|HPU) available", line)], text
    assert "smaller than the logging interval" not in text  # tiny data: an epoch is shorter than it
    assert "is deprecated" not in text
    assert len(lines) <= MOST_LINES, text
    # wandb says once where the run is, and how to upload it, in the summary.
    (sync_dir,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    said = [line for line in lines if "wandb" in line]
    assert said == [f"wandb: offline, in {sync_dir}; `wandb sync {sync_dir}` uploads it"], text
    assert lines.index(said[0]) < lines.index("--- sample at step 20 ---")
    assert len([line for line in lines if line.startswith("done: ")]) == 1


SCREENS = 2 * 50
"""README's run must fit on two 80 x 50 screens, wrapped lines counted as the rows they take."""


@pytest.mark.slow
def test_small_yamls_console_into_a_file_fits_on_two_screens(corpus: Path, tmp_path: Path) -> None:
    """small.yaml as README runs it (progress bar, samples, attention maps, report), at a tiny
    shape and with its four validations squeezed into 8 steps, logged to a file."""
    args = ["--config", "small.yaml", "--data.config.source", str(corpus)]
    args += ["--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.max_steps", "8"]
    args += ["--trainer.val_check_interval", "2", "--data.config.batch_size", "4"]
    args += ["--model.gpt.n_layer", "1", "--model.gpt.n_head", "2", "--model.gpt.n_embd", "32"]
    result, text = train_into_a_file(args, tmp_path)
    assert result.returncode == 0, text[-3000:]
    assert "\x1b" not in text and "\r" not in text, "a progress bar's codes in a file"
    lines = text.splitlines()
    rows = sum(max(1, -(-len(line) // 80)) for line in lines)
    assert rows <= SCREENS, text
    # The bar's plain lines: one at each tenth of the run (of 8 steps, 8), the last with its figures.
    progress = [line for line in lines if re.match(r"step \d+/8 \(\d+%\)", line)]
    assert len(progress) == 8 and progress[-1].startswith("step 8/8 (100%)"), text
    assert "train_loss" in progress[-1] and "val_loss" in progress[-1]
    assert [line for line in lines if line.startswith("--- sample at step")] == [
        f"--- sample at step {step} ---" for step in (2, 4, 6, 8)
    ]
    assert len([line for line in lines if line.startswith("done: ")]) == 1
