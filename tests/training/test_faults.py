"""Runs that crash, are interrupted or diverge lose nothing that was saved."""

from __future__ import annotations

import signal
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import torch

from minigpt.cli.train import train_main

from .conftest import REPO, finish, start_script, tiny_args

pytestmark = pytest.mark.slow

FAULTS = "tests.training.faults"
ENV = {"PYTHONPATH": str(REPO)}


@pytest.fixture(autouse=True)
def no_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """For the runs made in this process (train_main): no wandb, and the working directory in tmp."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


Ended = dict[str, tuple[Path, CompletedProcess[str]]]
"""Each run's folder and how it ended, by name."""

SIGNAL_RUNS = {
    "once SIGINT": ("SignalAt", signal.SIGINT),
    "twice SIGINT": ("SignalTwiceAt", signal.SIGINT),
    "twice SIGTERM": ("SignalTwiceAt", signal.SIGTERM),
}
"""train.py runs signalled during step 7, each in a process of its own. A single SIGTERM in a real
process is the two-process test's (test_ddp.py), and test_resume.py's in-process run
checks its exit status and checkpoint."""


@pytest.fixture(scope="module")
def signalled(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Ended:
    """Each of SIGNAL_RUNS: its run folder and how it ended. The three run at once."""
    started = {}
    for name, (fault, signum) in SIGNAL_RUNS.items():
        folder = tmp_path_factory.mktemp(name.replace(" ", "-"))
        args = tiny_args(
            corpus,
            folder / "run",
            f"--trainer.callbacks+={FAULTS}.{fault}",
            "--trainer.callbacks.step=7",
            f"--trainer.callbacks.signum={int(signum)}",
        )
        started[name] = (folder / "run", start_script("train.py", *args, cwd=folder, env=ENV))
    return {name: (run, finish(process)) for name, (run, process) in started.items()}


def test_a_signal_saves_a_checkpoint_and_exits_cleanly(
    signalled: Ended,
) -> None:
    run, result = signalled["once SIGINT"]
    assert result.returncode == 128 + signal.SIGINT, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "stopped by SIGINT: saved step 8" in result.stderr
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 8  # the step in progress was finished, then saved


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_stops_at_once(signalled: Ended, signum: signal.Signals) -> None:
    # Both signals arrive during step 7: the first asks to finish it and save, the second to stop now.
    run, result = signalled[f"twice {signum.name}"]
    assert "Traceback" not in result.stderr
    assert not (run / "checkpoints").exists()  # step 7 was neither finished nor saved
    assert "saved step" not in result.stderr
    assert result.returncode == 128 + signum, result.stderr[-2000:]  # interrupted, not failed


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("PoisonWeights", "the loss became nan at step 6"),
        ("PoisonGradients", "the gradient norm became inf at step 6"),
        ("PoisonBeforeValidation", "the validation loss became nan at step 8"),
    ],
)
def test_divergence_stops_with_the_step_and_keeps_the_last_good_checkpoint(
    fault: str, message: str, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Validations at steps 4 and 8; the fault strikes at step 6 or the validation at 8, always after
    # the checkpoint of step 4 and before the next one could be written.
    step = 8 if "Validation" in fault else 6
    run = tmp_path / "run"
    args = tiny_args(
        corpus,
        run,
        "--trainer.max_steps",
        "12",
        "--trainer.val_check_interval",
        "4",
        f"--trainer.callbacks+={FAULTS}.{fault}",
        f"--trainer.callbacks.step={step}",
    )
    assert train_main(args) == 1
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    last = run / "checkpoints" / "last.ckpt"
    assert last_line == f"error: training diverged: {message}; the last good checkpoint is {last}"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["global_step"] == 4
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())


def test_resume_needs_something_to_resume(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert train_main(tiny_args(corpus, tmp_path / "run", "--ckpt_path", "last")) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: --ckpt_path last: there is no")


def test_resume_from_a_truncated_checkpoint_is_one_line(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "half.ckpt"
    bad.write_bytes(b"PK\x03\x04 not really")
    assert train_main(tiny_args(corpus, tmp_path / "run", "--ckpt_path", str(bad))) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: cannot read checkpoint {bad}: truncated or not a PyTorch checkpoint"
    )


def test_a_checkpoint_that_cannot_resume_exactly_says_so(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    assert train_main(tiny_args(corpus, run, "--trainer.max_steps", "2")) == 0
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["minigpt_arithmetic"] == "32-true"  # tiny.yaml: fp32 and AdamW

    weights_only = tmp_path / "weights_only.ckpt"
    torch.save(
        {k: v for k, v in checkpoint.items() if k not in ("optimizer_states", "lr_schedulers")}, weights_only
    )
    capsys.readouterr()
    assert train_main(tiny_args(corpus, tmp_path / "again", "--ckpt_path", str(weights_only))) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: the checkpoint holds the weights only, without the optimizer's state: it cannot resume "
        "a run; start a new one from its weights with --model.init_from <checkpoint>"
    )

    # Written on a machine that trained in another precision: it resumes, and says it cannot be exact.
    other = tmp_path / "other.ckpt"
    torch.save({**checkpoint, "minigpt_arithmetic": "bf16-mixed"}, other)
    with caplog.at_level("WARNING", logger="minigpt"):
        args = tiny_args(corpus, tmp_path / "other", "--ckpt_path", str(other), "--trainer.max_steps", "3")
        assert train_main(args) == 0
    assert (
        "the checkpoint was trained in bf16-mixed and this machine trains in 32-true: the run goes on, "
        "but not bit for bit as it would have on the machine that wrote it"
    ) in caplog.text
