"""Loss curves from a run folder's CSV log alone: versions joined, tokens seen, a valid PNG, one-line
errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from minigpt.cli.report import report_main
from minigpt.viz.curves import plot_curves, read_run, smooth, write_curves

from .helpers import CONFIG, HEADER, make_run, png_size

# The first start: trained to step 19 (Lightning counts from 0), last checkpoint after step 9.
# The resumed start replays steps 10-19 from the checkpoint, then goes on to the end of the run.


def test_versions_join_in_order_and_the_resumed_one_wins_from_its_first_step(tmp_path: Path) -> None:
    log = read_run(make_run(tmp_path))
    train, val, lr = log.metrics["train_loss"], log.metrics["val_loss"], log.metrics["lr-AdamW/pg1"]
    # Steps completed: the CSV's step + 1.
    assert train.steps.tolist() == [5, 10, 15, 20]
    assert train.values.tolist() == [3.5, 3.0, 2.6, 2.5]
    # The first start's val loss at step 15 came after the checkpoint the run resumed from: undone.
    assert val.steps.tolist() == [10, 20] and val.values.tolist() == [2.3, 2.4567]
    assert lr.values.tolist() == [0.001, 0.002, 0.0015, 0.001]
    assert [v.name for v in log.versions] == ["version_9", "version_10"]
    assert "epoch" not in log.metrics and "step" not in log.metrics


def test_tokens_seen_from_the_config(tmp_path: Path) -> None:
    log = read_run(make_run(tmp_path))
    # 4 sequences x 8 tokens x 2 accumulated batches x 1 process = 64 tokens per step.
    assert log.tokens is not None
    assert log.tokens.steps.tolist() == [5, 10, 15, 20]
    assert log.tokens.values.tolist() == [320, 640, 960, 1280]
    assert log.notes == ()


def test_tokens_seen_assume_one_process_when_devices_is_not_a_number(tmp_path: Path) -> None:
    log = read_run(make_run(tmp_path, CONFIG.replace("devices: 1", "devices: auto")))
    assert log.tokens is not None and log.tokens.values[-1] == 1280
    assert len(log.notes) == 1 and "assume 1 process" in log.notes[0] and "'auto'" in log.notes[0]


def test_the_tokens_seen_column_wins_over_the_config(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run / "csv" / "version_10" / "metrics.csv").write_text("step,train_loss,tokens_seen\n19,2.5,999.0\n")
    log = read_run(run)
    assert (
        log.tokens is not None and log.tokens.steps.tolist() == [20] and log.tokens.values.tolist() == [999]
    )


def test_smooth_is_a_bias_corrected_moving_average() -> None:
    np.testing.assert_allclose(smooth(np.array([0.0, 1.0]), span=2), [0.0, 2 / 3])
    np.testing.assert_allclose(smooth(np.full(50, 3.0), span=10), np.full(50, 3.0))


def test_curves_are_drawn_from_the_csv_alone(tmp_path: Path) -> None:
    run = make_run(tmp_path, config=None)  # no config, no checkpoints, no samples: only metrics.csv
    out = write_curves(run)
    assert out == run / "loss_curves.png"
    assert png_size(out.read_bytes()) == (1200, 700)
    assert sorted(p.name for p in run.iterdir()) == ["csv", "loss_curves.png"]  # no temporary file left


def test_the_command_writes_curves_and_report_and_prints_their_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path, config=None)
    assert report_main(["--run", str(run)]) == 0
    assert capsys.readouterr().out.splitlines() == [str(run / "loss_curves.png"), str(run / "report.html")]
    assert png_size((run / "loss_curves.png").read_bytes()) == (1200, 700)


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("missing", "no run folder at"),
        ("no_csv", "no CSV log in"),
        ("empty_csv", "is empty"),
        ("bad_csv", "cannot read"),
    ],
)
def test_command_errors_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: str, message: str
) -> None:
    run = tmp_path / "run"
    if layout != "missing":
        run.mkdir()
    if layout in ("empty_csv", "bad_csv"):
        (run / "csv" / "version_0").mkdir(parents=True)
        text = HEADER if layout == "empty_csv" else HEADER + "0,,,four,,,\n"
        (run / "csv" / "version_0" / "metrics.csv").write_text(text)
    assert report_main(["--run", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (run / "report.html").exists()


def test_learning_rates_far_apart_share_a_log_axis(tmp_path: Path) -> None:
    """Muon's rate is ~20x AdamW's: on a linear axis AdamW's would be a flat line at 0, so rates
    whose peaks differ more than 4x are drawn on a log axis; one rate keeps a linear axis."""
    header = "epoch,lr-MuonWithAdamW/muon,lr-MuonWithAdamW/decay,step,train_loss,val_loss,val_ppl\n"
    rows = "".join(
        f",{0.02 * k / 3},{0.001 * k / 3},{4 * k},,,\n0,,,{4 * k},{4 - k / 2},,\n" for k in (1, 2, 3)
    )
    version = tmp_path / "run" / "csv" / "version_0"
    version.mkdir(parents=True)
    (version / "metrics.csv").write_text(header + rows)
    lr_ax = plot_curves(read_run(tmp_path / "run")).axes[1]
    assert lr_ax.get_yscale() == "log"
    assert [line.get_label() for line in lr_ax.get_lines()] == ["MuonWithAdamW/decay", "MuonWithAdamW/muon"]
    assert plot_curves(read_run(make_run(tmp_path / "other"))).axes[1].get_yscale() == "linear"
