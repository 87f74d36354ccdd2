"""A run shorter than its log and validation intervals, the first thing many users try, ends well."""

from __future__ import annotations

from pathlib import Path

import pytest

from minigpt.cli.train import train_main

from .conftest import tiny_args


@pytest.mark.slow
def test_a_run_shorter_than_its_log_interval_ends_with_a_checkpoint_and_a_report(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = tmp_path / "run"
    # tiny.yaml logs every 5 steps and validates every 20: 3 steps are shorter than both, and the
    # run validates once at its end all the same (ValidateAtEnd), logging that step.
    assert train_main(tiny_args(corpus, run, "--trainer.max_steps", "3")) == 0
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert (run / "checkpoints" / "best.ckpt").is_file()
    assert (run / "loss_curves.png").is_file()
    report = (run / "report.html").read_text(encoding="utf-8")
    assert "at step 3" in report  # the final validation loss
    assert "error" not in capsys.readouterr().err
