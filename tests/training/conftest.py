"""Fixtures for the training tests: a small corpus and a way to run the entry points."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
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


# -- Runs that several tests read ------------------------------------------------------------
# A launch of train.py on two CPU processes costs 10-30 s, most of it two Pythons importing
# Lightning, so each run below serves every check it can. They are session fixtures, so that
# test_ddp_equivalence.py and test_logging_ddp.py share them; a run's folder is left as it is
# once its fixture returns.

ENV = {"PYTHONPATH": str(REPO)}
"""train.py imports the probes and faults below from this repository's tests package."""

PROBES = "tests.training.probes"
FAULTS = "tests.training.faults"

DDP = ("--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp")

# One optimizer step is 1,024 tokens: 16 windows of 64. On two processes each reads 8 windows
# (accumulate_grad_batches 1); on one it reads 8 and 8 again (accumulate_grad_batches 2). The
# windows are the same either way: the epoch's random start positions are dealt to the ranks in
# turn, so rank 0 and rank 1 read between them the 16 windows one process reads in two batches.
# Validation reads 32 windows both ways: 2 batches of 8 per rank, or 4 on one process; it comes
# every 4 optimizer steps both ways (with tokens_per_step, val_check_interval counts steps).
SAME_RUN = ("--tokens_per_step", "1024", "--data.config.batch_size", "8", "--trainer.max_steps", "8")
SAME_RUN += ("--trainer.val_check_interval", "4", "--trainer.log_every_n_steps", "1")
ON_TWO = (*DDP, "--trainer.limit_val_batches", "2")
ON_ONE = ("--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.limit_val_batches", "4")

WITH_DROPOUT = (*DDP, "--model.gpt.dropout", "0.1", "--trainer.max_steps", "4")
"""tiny.yaml on two processes with dropout, so that every step draws from the random generator,
for 4 steps: fewer than its log interval (5) and its validation interval (20)."""

WANDB_SECRET = "sentinel" + "0123456789abcdef" * 2 + "sentinel"
"""The wandb API key of `one_process`, which no output or file of the run may hold."""


@dataclass(frozen=True)
class Launch:
    """A finished `train.py` run: the folder it ran in and what it printed."""

    folder: Path
    result: subprocess.CompletedProcess[str]

    @property
    def run(self) -> Path:
        """The run folder (`--trainer.default_root_dir`)."""
        return self.folder / "run"

    @property
    def records(self) -> Path:
        """What the probes recorded."""
        return self.folder / "records"


def launch(
    corpus: Path, folder: Path, *args: str, env: dict[str, str | None] | None = None, timeout: float = 240
) -> Launch:
    """tiny.yaml and `args`, run from `folder` into `folder/run`; RecordStepLoss (the loss of each
    step) and RecordSaves (each checkpoint file written, by rank) record into `folder/records`."""
    records = folder / "records"
    probes = [
        f"--trainer.callbacks+={PROBES}.RecordStepLoss",
        f"--trainer.callbacks.folder={records}",
        "--trainer.plugins",
        json.dumps([{"class_path": f"{PROBES}.RecordSaves", "init_args": {"folder": str(records)}}]),
    ]
    args = tiny_args(corpus, folder / "run", *args, *probes)
    result = run_script("train.py", *args, cwd=folder, env={**ENV, **(env or {})}, timeout=timeout)
    return Launch(folder, result)


def record_ranks(folder: Path) -> tuple[str, ...]:
    """RecordRank, writing `rank<r>.json` (process id, windows, validation losses) into `folder`."""
    return (f"--trainer.callbacks+={PROBES}.RecordRank", f"--trainer.callbacks.folder={folder}")


@pytest.fixture(scope="session")
def two_processes(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    """SAME_RUN on two processes, each rank recording what it read (RecordRank), with tiny.yaml's
    loggers and no wandb credentials: wandb logs offline, into the run folder."""
    folder = tmp_path_factory.mktemp("two-processes")
    no_credentials = {"WANDB_MODE": None, "WANDB_API_KEY": None, "NETRC": str(folder / "no-netrc")}
    two = launch(corpus, folder, *SAME_RUN, *ON_TWO, *record_ranks(folder / "records"), env=no_credentials)
    assert two.result.returncode == 0, two.result.stderr[-3000:]
    assert (
        "global batch 1,024 tokens (micro-batch 8 x 64 tokens x 1 accumulated x 2 processes)"
        in two.result.stderr
    )
    return two


@pytest.fixture(scope="session")
def one_process(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    """SAME_RUN on one process, its loggers listed in a YAML file of their own: tiny.yaml's CSV log
    and wandb, and Lightning's CSVLogger writing into `<folder>/elsewhere/extra`. It is logged in to
    wandb with WANDB_SECRET, and the server refuses connections (a port bound but not listening),
    whatever this machine's network: the run must fall back to offline logging without hanging."""
    folder = tmp_path_factory.mktemp("one-process")
    loggers = folder / "loggers.yaml"
    loggers.write_text(
        "trainer:\n"
        "  logger:\n"
        "    - class_path: minigpt.training.loggers.CSVLogger\n"
        "    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        f"      init_args: {{save_dir: {folder / 'elsewhere'}, name: extra}}\n"
        "    - class_path: minigpt.training.loggers.WandbLogger\n"
    )
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        env = {
            "WANDB_MODE": None,
            "WANDB_API_KEY": WANDB_SECRET,
            "WANDB_BASE_URL": f"http://127.0.0.1:{closed.getsockname()[1]}",
            "NETRC": str(folder / "no-netrc"),
        }
        one = launch(corpus, folder, "--config", str(loggers), *SAME_RUN, *ON_ONE, env=env, timeout=120)
    assert one.result.returncode == 0, one.result.stderr[-3000:]
    return one


@pytest.fixture(scope="session")
def with_dropout(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    """WITH_DROPOUT straight through; its exit status is the test's to check."""
    return launch(corpus, tmp_path_factory.mktemp("with-dropout"), *WITH_DROPOUT)


@pytest.fixture(scope="session")
def stopped_with_dropout(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    """WITH_DROPOUT with SIGTERM to rank 1 as the second step starts: both ranks finish that step,
    save it and stop. Each rank records its process id (RecordRank)."""
    folder = tmp_path_factory.mktemp("stopped-with-dropout")
    stop = (f"--trainer.callbacks+={FAULTS}.SignalAt", "--trainer.callbacks.step=1")
    stop += (f"--trainer.callbacks.signum={int(signal.SIGTERM)}", "--trainer.callbacks.rank=1")
    return launch(corpus, folder, *WITH_DROPOUT, *stop, *record_ranks(folder / "records"), timeout=180)


@pytest.fixture(scope="session")
def resumed_with_dropout(
    stopped_with_dropout: Launch, corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> Launch:
    """A copy of the stopped run's folder, resumed with `--ckpt_path last` to the end of WITH_DROPOUT."""
    folder = tmp_path_factory.mktemp("resumed-with-dropout")
    shutil.copytree(stopped_with_dropout.run, folder / "run")
    return launch(corpus, folder, *WITH_DROPOUT, "--ckpt_path", "last")
