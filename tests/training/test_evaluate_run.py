"""evaluate.py on a run folder, given nothing else, prints the run's own last validation figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minigpt.cli.evaluate import evaluate_main

from .conftest import run_script, tiny_args
from .helpers import read_metrics

pytestmark = pytest.mark.slow


def test_evaluate_prints_the_runs_final_validation(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # 6 steps: the only validation is the one at the end (tiny.yaml validates every 20).
    result = run_script(
        "train.py", *tiny_args(corpus, tmp_path / "run", "--trainer.max_steps", "6"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    final = [row for row in read_metrics(tmp_path / "run") if row.get("val_bpb")][-1]
    monkeypatch.chdir(tmp_path)  # where the run started: its data_cache
    assert evaluate_main(["--checkpoint", "run"]) == 0
    printed = capsys.readouterr()
    rows = {
        line.split()[1]: line.split()[2] for line in printed.out.splitlines() if line.startswith("validation")
    }
    assert rows == {
        "bits_per_byte": f"{float(final['val_bpb']):.4f}",
        "loss": f"{float(final['val_loss']):.4f}",
    }
    results = json.loads((tmp_path / "run" / "evaluation.json").read_text())["results"]
    # The run logged float32 values of the same sums.
    assert results[0]["value"] == pytest.approx(float(final["val_bpb"]), rel=1e-6)
    assert "validation of run: 64 windows" in printed.err  # tiny.yaml's 4 batches of 16
