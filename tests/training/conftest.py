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
) -> subprocess.CompletedProcess[str]:
    """Run `python <repo>/<script> args...` as a user would, from `cwd`."""
    return finish(start_script(script, *args, cwd=cwd, env=env), timeout)


def start_script(
    script: str, *args: str, cwd: Path, env: dict[str, str | None] | None = None
) -> subprocess.Popen[str]:
    """`run_script`, started and not waited for."""
    full_env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true", **(env or {})}
    full_env = {key: value for key, value in full_env.items() if value is not None}  # None unsets
    return subprocess.Popen(
        [sys.executable, str(REPO / script), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )


def finish(process: subprocess.Popen[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """What the started process printed and how it ended (killed after `timeout` seconds)."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


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
# Lightning, so each run below serves every check it can. Their checks are test_ddp.py's, in one
# file so that pytest-xdist runs them on one worker and each run is launched once; a run's folder
# is left as it is once its fixture returns.

ENV = {"PYTHONPATH": str(REPO)}
"""train.py imports the probes and faults below from this repository's tests package."""

PROBES = "tests.training.probes"
FAULTS = "tests.training.faults"

DDP = ("--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp")

# One optimizer step is 1,024 tokens: 16 windows of 64. On two processes each reads 8 windows
# (accumulate_grad_batches 1); on one it reads 8 and 8 again (accumulate_grad_batches 2). The
# windows are the same either way: the epoch's random start positions are dealt to the ranks in
# turn, so rank 0 and rank 1 read between them the 16 windows one process reads in two batches.
# Validation reads the same 32 windows both ways (limit_val_batches counts the batches of the whole
# run): 2 batches of 8 per rank, or 4 on one process; it comes every 4 optimizer steps both ways
# (with tokens_per_step, val_check_interval counts steps).
SAME_RUN = ("--tokens_per_step", "1024", "--data.config.batch_size", "8", "--trainer.max_steps", "8")
SAME_RUN += ("--trainer.val_check_interval", "4", "--trainer.log_every_n_steps", "1")
SAME_RUN += ("--trainer.limit_val_batches", "4")
ON_TWO = DDP
ON_ONE = ("--trainer.accelerator", "cpu", "--trainer.devices", "1")

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
    return Launch(folder, finish(start_launch(corpus, folder, *args, env=env), timeout))


def start_launch(
    corpus: Path, folder: Path, *args: str, env: dict[str, str | None] | None = None
) -> subprocess.Popen[str]:
    """`launch`, started and not waited for: two launches that do not depend on each other run at
    once, the second filling the core the first leaves idle while its rank 1 starts up."""
    records = folder / "records"
    probes = [
        f"--trainer.callbacks+={PROBES}.RecordStepLoss",
        f"--trainer.callbacks.folder={records}",
        "--trainer.plugins",
        json.dumps([{"class_path": f"{PROBES}.RecordSaves", "init_args": {"folder": str(records)}}]),
    ]
    args = tiny_args(corpus, folder / "run", *args, *probes)
    return start_script("train.py", *args, cwd=folder, env={**ENV, **(env or {})})


def record_ranks(folder: Path) -> tuple[str, ...]:
    """RecordRank, writing `rank<r>.json` (process id, windows, validation losses) into `folder`."""
    return (f"--trainer.callbacks+={PROBES}.RecordRank", f"--trainer.callbacks.folder={folder}")


@pytest.fixture(scope="session")
def same_run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Launch, Launch]:
    """SAME_RUN on two processes and on one, launched at once (see `two_processes`, `one_process`)."""
    two_folder, one_folder = tmp_path_factory.mktemp("two-processes"), tmp_path_factory.mktemp("one-process")
    # Two processes, each rank recording what it read (RecordRank), with tiny.yaml's loggers and no
    # wandb credentials: wandb logs offline, into the run folder.
    no_credentials = {"WANDB_MODE": None, "WANDB_API_KEY": None, "NETRC": str(two_folder / "no-netrc")}
    two = start_launch(
        corpus, two_folder, *SAME_RUN, *ON_TWO, *record_ranks(two_folder / "records"), env=no_credentials
    )
    # One process, its loggers listed in a YAML file of their own: tiny.yaml's CSV log and wandb,
    # and Lightning's CSVLogger writing into `<folder>/elsewhere/extra`. It is logged in to wandb
    # with WANDB_SECRET, and the server refuses connections (a port bound but not listening),
    # whatever this machine's network: the run must fall back to offline logging without hanging.
    loggers = one_folder / "loggers.yaml"
    loggers.write_text(
        "trainer:\n"
        "  logger:\n"
        "    - class_path: minigpt.training.loggers.SafeCSVLogger\n"
        "    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        f"      init_args: {{save_dir: {one_folder / 'elsewhere'}, name: extra}}\n"
        "    - class_path: minigpt.training.loggers.AutoWandbLogger\n"
    )
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        env = {
            "WANDB_MODE": None,
            "WANDB_API_KEY": WANDB_SECRET,
            "WANDB_BASE_URL": f"http://127.0.0.1:{closed.getsockname()[1]}",
            "NETRC": str(one_folder / "no-netrc"),
        }
        one = start_launch(corpus, one_folder, "--config", str(loggers), *SAME_RUN, *ON_ONE, env=env)
        one_done = Launch(one_folder, finish(one, timeout=120))
    return Launch(two_folder, finish(two)), one_done


@pytest.fixture(scope="session")
def two_processes(same_run: tuple[Launch, Launch]) -> Launch:
    """`same_run`'s launch on two processes, which must have split the global batch between them."""
    two = same_run[0]
    assert two.result.returncode == 0, two.result.stderr[-3000:]
    assert (
        "global batch 1,024 tokens (micro-batch 8 windows x 64 tokens x 1 accumulated x 2 processes)"
        in two.result.stderr
    )
    return two


@pytest.fixture(scope="session")
def one_process(same_run: tuple[Launch, Launch]) -> Launch:
    """`same_run`'s launch on one process, with loggers of its own and a wandb server that refuses."""
    one = same_run[1]
    assert one.result.returncode == 0, one.result.stderr[-3000:]
    return one


@pytest.fixture(scope="session")
def dropout_runs(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Launch, Launch]:
    """`with_dropout` and `stopped_with_dropout`, launched at once."""
    straight_folder = tmp_path_factory.mktemp("with-dropout")
    stopped_folder = tmp_path_factory.mktemp("stopped-with-dropout")
    straight = start_launch(corpus, straight_folder, *WITH_DROPOUT)
    stop = (f"--trainer.callbacks+={FAULTS}.SignalAt", "--trainer.callbacks.step=1")
    stop += (f"--trainer.callbacks.signum={int(signal.SIGTERM)}", "--trainer.callbacks.rank=1")
    stopped = start_launch(
        corpus, stopped_folder, *WITH_DROPOUT, *stop, *record_ranks(stopped_folder / "records")
    )
    stopped_done = Launch(stopped_folder, finish(stopped, timeout=180))
    return Launch(straight_folder, finish(straight)), stopped_done


@pytest.fixture(scope="session")
def with_dropout(dropout_runs: tuple[Launch, Launch]) -> Launch:
    """WITH_DROPOUT straight through; its exit status is the test's to check."""
    return dropout_runs[0]


@pytest.fixture(scope="session")
def stopped_with_dropout(dropout_runs: tuple[Launch, Launch]) -> Launch:
    """WITH_DROPOUT with SIGTERM to rank 1 as the second step starts: both ranks finish that step,
    save it and stop. Each rank records its process id (RecordRank)."""
    return dropout_runs[1]


@pytest.fixture(scope="session")
def resumed_with_dropout(
    stopped_with_dropout: Launch, corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> Launch:
    """A copy of the stopped run's folder, resumed with `--ckpt_path last` to the end of WITH_DROPOUT."""
    folder = tmp_path_factory.mktemp("resumed-with-dropout")
    shutil.copytree(stopped_with_dropout.run, folder / "run")
    return launch(corpus, folder, *WITH_DROPOUT, "--ckpt_path", "last")


FSDP_STRATEGY = {
    "class_path": f"{PROBES}.CPUFSDPStrategy",
    "init_args": {
        "auto_wrap_policy": ["minigpt.model.gpt.Block"],
        "activation_checkpointing_policy": ["minigpt.model.gpt.Block"],
        "state_dict_type": "sharded",
    },
}
"""Lightning's FSDPStrategy with gpt2-medium.yaml's settings, on CPU processes (see CPUFSDPStrategy)."""


@pytest.fixture(scope="session")
def fsdp_and_diverged(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Launch, Launch]:
    """Two more runs on two processes, launched at once: SAME_RUN under FSDP (`FSDP_STRATEGY`,
    weight decay on), and tiny.yaml with rank 1's weights poisoned at step 3 (PoisonWeights), each
    rank recording its process id (RecordRank)."""
    fsdp_folder, diverged_folder = tmp_path_factory.mktemp("fsdp"), tmp_path_factory.mktemp("diverged")
    fsdp = ("--trainer.accelerator", "cpu", "--trainer.devices", "2")
    fsdp += ("--trainer.strategy", json.dumps(FSDP_STRATEGY))
    sharded = start_launch(corpus, fsdp_folder, *SAME_RUN, *fsdp)
    poison = (f"--trainer.callbacks+={FAULTS}.PoisonWeights", "--trainer.callbacks.step=3")
    poison += ("--trainer.callbacks.rank=1", *record_ranks(diverged_folder / "records"))
    diverged = start_launch(corpus, diverged_folder, *DDP, *poison)
    diverged_done = Launch(diverged_folder, finish(diverged, timeout=180))
    return Launch(fsdp_folder, finish(sharded)), diverged_done
