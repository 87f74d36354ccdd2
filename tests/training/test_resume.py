"""The shipped recipe resumes exactly, however its run ended.

small.yaml as shipped (Muon for the blocks' matrices, the weight average EMAWeights, the precision
this CPU trains in), shrunk to a shape that trains in seconds and given dropout, so that every
step draws from the random generator. One straight run of 10 steps, validated and saved every 5,
is the reference; three runs that ended early are resumed with `--ckpt_path last`:

- killed by SIGKILL after the checkpoint of step 5 (in a process of its own, as a crash is);
- stopped by SIGTERM during step 8, which finishes that step, saves it and validates once more;
- finished at `max_steps` 7, between validations, then trained on to 10 (the schedule is all
  warmup here, so its length does not move the learning rate of any step).

Each must log the same loss at every step as the straight run, under the same step numbers, and
end with the same raw weights, average, optimizer state and generator state, bit for bit.
"""

from __future__ import annotations

import csv
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from minigpt.cli.train import train_main
from minigpt.training.precision import has_native_bf16

from .conftest import REPO, run_script
from .helpers import assert_identical, last_checkpoint, step_losses

pytestmark = pytest.mark.slow

FAULTS = "tests.training.faults"

AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
"""On a CPU with native bf16, makes oneDNN's bf16 check say no: the machine then trains in fp32,
as one without native bf16 does."""


def quick_maps(folder: Path) -> Path:
    """A config over small.yaml that draws the attention maps for a 6-character prompt: the default
    line, 45 characters at char level, makes each validation's drawing cost more than its steps."""
    path = folder / "quick_maps.yaml"
    path.write_text(yaml.safe_dump({"callbacks": {"AttentionMaps": {"prompt": "ROMEO:"}}}))
    return path


def small_args(corpus: Path, run: Path, *extra: str) -> list[str]:
    return [
        "--config",
        "small.yaml",
        "--config",
        str(quick_maps(run.parent)),
        "--data.config.source",
        str(corpus),
        "--data.config.tokenizer",
        "char",
        "--data.config.batch_size",
        "4",
        "--model.gpt.context_length",
        "32",
        "--model.gpt.n_layer",
        "2",
        "--model.gpt.n_head",
        "2",
        "--model.gpt.n_embd",
        "64",
        "--model.gpt.dropout",
        "0.1",
        "--model.optim.warmup_steps",
        "10",
        "--trainer.max_steps",
        "10",
        "--trainer.val_check_interval",
        "5",
        "--trainer.limit_val_batches",
        "1",
        "--trainer.log_every_n_steps",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        # The CPU's arithmetic is the subject: on a machine with a GPU, small.yaml's `auto` takes the GPU.
        "--trainer.accelerator",
        "cpu",
        "--trainer.default_root_dir",
        str(run),
        *extra,
    ]


def assert_same_run(resumed: Path, straight: Path) -> None:
    losses = step_losses(straight)
    assert sorted(losses) == list(range(10))
    assert step_losses(resumed) == losses
    a, b = last_checkpoint(resumed), last_checkpoint(straight)
    assert a["global_step"] == b["global_step"] == 10
    for key in (
        "state_dict",
        "current_model_state",
        "averaging_state",
        "optimizer_states",
        "torch_rng_state",
    ):
        assert_identical(a[key], b[key], key)


@pytest.fixture(scope="module")
def straight(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: 10 steps straight through, in this process. It announces the precision this
    CPU trains in, for the model and for Muon."""
    folder = tmp_path_factory.mktemp("resume")
    with pytest.MonkeyPatch.context() as patch, LogRecords() as records:
        patch.chdir(folder)  # the data cache stays in tmp
        patch.setenv("WANDB_MODE", "disabled")
        assert train_main(small_args(corpus, folder / "straight")) == 0
    dtype, precision = ("bfloat16", "bf16-mixed") if has_native_bf16("cpu") else ("float32", "32-true")
    assert f"{precision} on cpu" in records.text
    assert f"Muon orthogonalises in {dtype}" in records.text
    return folder / "straight"


class LogRecords(logging.Handler):
    """What the `minigpt` logger says while in use, as one text."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.text = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.text += record.getMessage() + "\n"

    def __enter__(self) -> LogRecords:
        # setLevel, not an assignment to `level`: loggers cache what each level's isEnabledFor gave,
        # and only setLevel clears that cache. A logger asked at INFO while its level was WARNING
        # (by an earlier test in this process) would otherwise stay silent at INFO.
        logger = logging.getLogger("minigpt")
        self.level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger("minigpt")
        logger.removeHandler(self)
        logger.setLevel(self.level)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # the data cache and wandb stay in tmp
    monkeypatch.setenv("WANDB_MODE", "disabled")
    return tmp_path


def test_a_small_yaml_run_killed_by_sigkill_resumes_bit_exactly(
    corpus: Path, in_tmp: Path, straight: Path
) -> None:
    killed = in_tmp / "killed"
    crash = run_script(
        "train.py",
        *small_args(corpus, killed, f"--trainer.callbacks+={FAULTS}.SignalAt", "--trainer.callbacks.step=7"),
        cwd=in_tmp,
        env={"PYTHONPATH": str(REPO)},
    )
    assert crash.returncode == -signal.SIGKILL, crash.stderr[-2000:]
    assert last_checkpoint(killed)["global_step"] == 5
    assert train_main(small_args(corpus, killed, "--ckpt_path", "last")) == 0
    assert_same_run(killed, straight)


def test_a_small_yaml_run_stopped_by_sigterm_resumes_bit_exactly(
    corpus: Path, in_tmp: Path, straight: Path
) -> None:
    stopped = in_tmp / "stopped"
    term = (f"--trainer.callbacks+={FAULTS}.SignalAt", "--trainer.callbacks.step=7")
    term += (f"--trainer.callbacks.signum={int(signal.SIGTERM)}",)
    assert train_main(small_args(corpus, stopped, *term)) == 128 + signal.SIGTERM
    assert last_checkpoint(stopped)["global_step"] == 8
    assert train_main(small_args(corpus, stopped, "--ckpt_path", "last")) == 0
    assert_same_run(stopped, straight)


def test_a_finished_small_yaml_run_trains_on_bit_exactly(corpus: Path, in_tmp: Path, straight: Path) -> None:
    finished = in_tmp / "finished"
    assert train_main(small_args(corpus, finished, "--trainer.max_steps", "7")) == 0
    assert last_checkpoint(finished)["global_step"] == 7
    assert train_main(small_args(corpus, finished, "--ckpt_path", "last")) == 0
    assert_same_run(finished, straight)


def test_the_same_in_fp32_where_the_cpu_has_native_bf16(tmp_path: Path) -> None:
    """The SIGTERM test above in a process that sees no native bf16, so that it trains in fp32 and
    Muon orthogonalises in fp32: on a CPU with native bf16 this is the other kind of machine. (The
    other two ways end differently and resume through the same code; this one needs no third
    process.)"""
    if not has_native_bf16("cpu"):
        pytest.skip("this CPU trains in fp32 (no bf16, or bf16 measured slower): the tests above ran in fp32")
    test = f"{Path(__file__).relative_to(REPO)}::test_a_small_yaml_run_stopped_by_sigterm_resumes_bit_exactly"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", test],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **AVX2_ONLY},
    )
    failure = [line for line in result.stdout.splitlines() if line.startswith(("E ", ">", "FAILED"))]
    assert result.returncode == 0, "\n".join(failure[:40]) or result.stdout[-3000:]
    assert "1 passed" in result.stdout


def test_a_checkpoint_from_before_the_groups_had_names_resumes_under_the_names_it_began_with(
    corpus: Path, in_tmp: Path, straight: Path
) -> None:
    """Checkpoints written before the optimizer's groups were named hold groups without a "name".
    They resume exactly, and the learning rates go on under the pg1, pg2, pg3 columns the run's
    first part logged, not under new ones."""
    older = in_tmp / "older"
    assert train_main(small_args(corpus, older, "--trainer.max_steps", "7")) == 0
    checkpoint = last_checkpoint(older)
    for inner in checkpoint["optimizer_states"][0].values():  # Muon's and AdamW's state dicts
        for group in inner["param_groups"]:
            del group["name"]
    torch.save(checkpoint, older / "checkpoints" / "last.ckpt")
    assert train_main(small_args(corpus, older, "--ckpt_path", "last")) == 0
    with open(older / "csv" / "version_1" / "metrics.csv", newline="") as f:
        columns = {name for row in csv.DictReader(f) for name, value in row.items() if value}
    assert {c for c in columns if c.startswith("lr-")} == {f"lr-MuonWithAdamW/pg{i}" for i in (1, 2, 3)}
    assert step_losses(older) == step_losses(straight)


def test_a_checkpoint_from_before_the_step_was_written_out_resumes_at_its_step(
    corpus: Path, in_tmp: Path, straight: Path
) -> None:
    """Checkpoints written while Lightning took the optimizer's step (automatic optimization) count
    their steps where manual optimization does not look. They resume at their own step, exactly."""
    older = in_tmp / "older"
    assert train_main(small_args(corpus, older, "--trainer.max_steps", "7")) == 0
    checkpoint = last_checkpoint(older)
    fit = checkpoint["loops"]["fit_loop"]
    manual = fit["epoch_loop.manual_optimization.optim_step_progress"]
    automatic = fit["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"]
    for scope in ("total", "current"):  # as automatic optimization wrote them
        automatic[scope] = dict(manual[scope])
        manual[scope] = {"ready": 0, "completed": 0}
    torch.save(checkpoint, older / "checkpoints" / "last.ckpt")
    assert train_main(small_args(corpus, older, "--ckpt_path", "last")) == 0
    assert step_losses(older) == step_losses(straight)
