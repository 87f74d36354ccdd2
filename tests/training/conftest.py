"""Fixtures for the training tests: a small corpus and a way to run the entry points."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

WORDS = (
    "the king my lord good sweet love night day heaven death life heart eyes fair noble "
    "what shall thou thee thy art hath doth come go speak hear see know stay farewell"
).split()
SPEAKERS = ["ROMEO", "JULIET", "KING HENRY", "FIRST CITIZEN", "HAMLET"]


def make_play(num_speeches: int, seed: int = 0) -> str:
    """Deterministic play-shaped text: speakers, short lines, blank lines."""
    rng = random.Random(seed)
    speeches = []
    for _ in range(num_speeches):
        lines = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + rng.choice(",.!?")
        ]
        lines += [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) + "."
            for _ in range(rng.randint(0, 2))
        ]
        speeches.append(f"{rng.choice(SPEAKERS)}:\n" + "\n".join(lines) + "\n")
    return "\n".join(speeches)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "play.txt"
    path.write_text(make_play(1500))
    return path


def run_script(
    script: str, *args: str, cwd: Path, timeout: float = 240, env: dict[str, str | None] | None = None
):
    """Run `python <repo>/<script> args...` as a user would, from `cwd`."""
    full_env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true", **(env or {})}
    full_env = {key: value for key, value in full_env.items() if value is not None}  # None unsets
    return subprocess.run(
        [sys.executable, str(REPO / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def tiny_args(corpus: Path, out_dir: Path, *extra: str) -> list[str]:
    """tiny.yaml on the test corpus, writing into out_dir, with no progress bar noise."""
    return [
        "--config",
        "tiny.yaml",
        "--data.config.source",
        str(corpus),
        "--trainer.default_root_dir",
        str(out_dir),
        "--trainer.enable_progress_bar",
        "false",
        *extra,
    ]
