"""docs/data.md's one command for a text of your own, as written, on a 12 KB file: small.yaml
learns the vocabulary the text supports, says so in one line, trains and validates at its end."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from .conftest import REPO, make_play, run_script

pytestmark = pytest.mark.slow

QUICK = ("--trainer.max_steps", "2", "--model.gpt.n_layer", "1", "--trainer.enable_progress_bar", "false")
"""Two steps of a one-layer model: what the command does to the data does not depend on them."""


def own_text_command() -> list[str]:
    lines = (REPO / "docs" / "data.md").read_text().splitlines()
    (line,) = [line for line in lines if line.startswith("python train.py") and "my_text.txt" in line]
    return shlex.split(line, comments=True)[2:]


def test_the_documented_command_trains_small_yaml_on_a_small_file(tmp_path: Path) -> None:
    (tmp_path / "my_text.txt").write_text(make_play(400)[:12_000])
    result = run_script("train.py", *own_text_command(), *QUICK, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if "data.vocab_size" in line]
    assert "fewer than the default 4096: using" in line
    assert "best val loss" in result.stderr  # validated, although small.yaml's interval is 375 steps
    assert (tmp_path / "runs" / "mine" / "checkpoints" / "best.ckpt").is_file()
