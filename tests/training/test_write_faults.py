"""A full disk or a folder the run may not write ends the run in one line, loses no checkpoint
written before, and leaves a run that `--ckpt_path last` resumes."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest
import torch

from minigpt.cli.train import train_main
from minigpt.common import sha256_file
from minigpt.training.callbacks.checkpoints import AtomicCheckpointIO, CheckpointWriteError

from .conftest import DDP, FAULTS, launch, tiny_args
from .faults import FailingSaveAt
from .helpers import step_losses

VALIDATED = (
    "--trainer.max_steps",
    "12",
    "--trainer.val_check_interval",
    "4",
    "--trainer.log_every_n_steps",
    "1",
)
"""Validations at steps 4, 8 and 12, each saving best.ckpt, then last.ckpt."""


@pytest.fixture(autouse=True)
def no_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No wandb, and the working directory in tmp."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")


def fail_at(save: FailingSaveAt, args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run train.py in this process with `save` in place of torch.save: its exit code and stderr."""
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "save", save)
        code = train_main(args)
    return code, capsys.readouterr().err


def error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    return stderr.strip().splitlines()[-1]


def test_torchs_own_word_that_it_could_not_write_is_a_write_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch.save given a path writes from C++, and says only this when the disk fills.
    def failing(*args, **kwargs):
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", failing)
    with pytest.raises(CheckpointWriteError, match=r"last.ckpt: the write failed \(.* free there"):
        AtomicCheckpointIO().save_checkpoint({"w": torch.ones(4)}, tmp_path / "last.ckpt")
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_larger_than_the_free_space_is_refused_before_a_byte_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tied = torch.ones(1000)  # 4,000 bytes, twice in the checkpoint as a tied weight is, written once
    checkpoint = {"state_dict": {"wte": tied, "lm_head": tied}, "optimizer_states": [{"m": torch.ones(500)}]}
    writes: list[object] = []
    monkeypatch.setattr(torch, "save", lambda *args, **kwargs: writes.append(args))
    monkeypatch.setattr("minigpt.training.callbacks.checkpoints.free_space", lambda path: 5_999)
    with pytest.raises(CheckpointWriteError, match=r"last.ckpt: no space left on device \(0.0 MB free there"):
        AtomicCheckpointIO().save_checkpoint(checkpoint, tmp_path / "last.ckpt")
    assert writes == [] and list(tmp_path.iterdir()) == []
    monkeypatch.setattr(
        "minigpt.training.callbacks.checkpoints.free_space", lambda path: 6_000
    )  # 4,000 + 2,000 bytes
    AtomicCheckpointIO().save_checkpoint(checkpoint, tmp_path / "last.ckpt")
    assert len(writes) == 1


def test_other_errors_in_a_save_keep_their_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO))  # a failing disk: not for a one-line answer

    monkeypatch.setattr(torch, "save", failing)
    with pytest.raises(OSError) as raised:
        AtomicCheckpointIO().save_checkpoint({}, tmp_path / "last.ckpt")
    assert not isinstance(raised.value, CheckpointWriteError)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_ends_the_run_with_one_line_and_keeps_the_earlier_checkpoints(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    checkpoints = run / "checkpoints"
    full_disk = FailingSaveAt(nth=3)  # best.ckpt at step 8, over step 4's
    code, stderr = fail_at(full_disk, tiny_args(corpus, run, *VALIDATED), capsys)

    assert code == 1
    assert full_disk.failed == "best.ckpt"
    line = error_line(stderr)
    assert line.startswith(
        f"error: cannot write checkpoint {checkpoints / 'best.ckpt'}: no space left on device ("
    )
    assert "free there, the checkpoint needs about " in line
    assert line.endswith(
        f"; the newest complete checkpoint is {checkpoints / 'last.ckpt'}; once there is room or the "
        "folder is writable, resume from it with the same command and --ckpt_path last"
    )
    assert set(full_disk.before) == {"best.ckpt", "last.ckpt"}
    after = {path.name: sha256_file(path) for path in checkpoints.iterdir()}  # no temporary file among them
    assert after == full_disk.before
    assert torch.load(checkpoints / "best.ckpt", weights_only=True)["global_step"] == 4


@pytest.mark.slow
def test_a_full_disk_before_last_ckpt_resumes_from_best_ckpt(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    best = run / "checkpoints" / "best.ckpt"
    full_disk = FailingSaveAt(nth=2)  # last.ckpt at step 4, just after best.ckpt
    code, stderr = fail_at(full_disk, tiny_args(corpus, run, *VALIDATED), capsys)

    assert code == 1
    assert full_disk.failed == "last.ckpt"
    assert error_line(stderr).endswith(
        f"; the newest complete checkpoint is {best}; once there is room or the folder is writable, "
        "resume from it with the same command and --ckpt_path last"
    )
    assert [path.name for path in best.parent.iterdir()] == ["best.ckpt"]
    assert sha256_file(best) == full_disk.before["best.ckpt"]

    with caplog.at_level("INFO", logger="minigpt"):
        assert train_main(tiny_args(corpus, run, *VALIDATED, "--ckpt_path", "last")) == 0
    assert (
        f"--ckpt_path last: resuming from {best}, the newest checkpoint there (no last.ckpt)" in caplog.text
    )
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 12
    # The resumed run trains as a run that never failed does, loss for loss.
    straight = tmp_path / "straight"
    assert train_main(tiny_args(corpus, straight, *VALIDATED)) == 0
    assert step_losses(run) == step_losses(straight)
    assert len(step_losses(run)) == 12


@pytest.mark.slow
def test_a_full_disk_before_a_newer_last_ckpt_names_the_newer_checkpoint(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Step 8's best.ckpt is written, its last.ckpt is not: last.ckpt still holds step 4, and
    # `--ckpt_path last` would take it, so the line names best.ckpt's path instead.
    run = tmp_path / "run"
    best = run / "checkpoints" / "best.ckpt"
    code, stderr = fail_at(FailingSaveAt(nth=4), tiny_args(corpus, run, *VALIDATED), capsys)
    assert code == 1
    assert error_line(stderr).endswith(f"resume from it with the same command and --ckpt_path {best}")
    assert torch.load(best, weights_only=True)["global_step"] == 8


@pytest.mark.slow
def test_a_folder_made_read_only_before_the_first_checkpoint_says_none_was_written(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    denied = FailingSaveAt(nth=1, error=errno.EACCES, room=0)
    code, stderr = fail_at(denied, tiny_args(corpus, run, "--trainer.max_steps", "4"), capsys)

    assert code == 1
    assert error_line(stderr).startswith(
        f"error: cannot write checkpoint {run / 'checkpoints' / 'best.ckpt'}: permission denied ("
    )
    assert error_line(stderr).endswith("; no checkpoint was written")
    assert list((run / "checkpoints").iterdir()) == []


def refuse_inside(folder: Path, error: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make creating a file or folder in `folder` raise OSError(`error`), as a read-only or another
    user's folder does for anyone but root (the tests may run as root, whom chmod does not stop)."""
    for name in ("open", "mkdir"):
        real = getattr(os, name)

        def refusing(path, *args, real=real, **kwargs):
            target = Path(os.fsdecode(path)).absolute()
            creates = not (real is os.mkdir and target.exists())  # open's O_TMPFILE names the folder
            if creates and target.parent.exists() and target.is_relative_to(folder):
                raise OSError(error, os.strerror(error), os.fsdecode(path))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, name, refusing)


@pytest.mark.parametrize(
    ("error", "why"), [(errno.EACCES, "permission denied"), (errno.EROFS, "read-only filesystem")]
)
def test_a_run_folder_it_may_not_write_is_refused_at_the_start(
    error: int,
    why: str,
    corpus: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    refuse_inside(run, error, monkeypatch)
    assert train_main(tiny_args(corpus, run)) == 2
    assert error_line(capsys.readouterr().err) == f"error: cannot write the run folder {run}: {why}"


def test_a_run_folder_whose_parent_cannot_be_created_is_refused_at_the_start(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    refuse_inside(theirs, errno.EACCES, monkeypatch)
    run = theirs / "new" / "run"
    assert train_main(tiny_args(corpus, run)) == 2
    assert error_line(capsys.readouterr().err) == (
        f"error: cannot write the run folder {run}: permission denied at {theirs / 'new'}"
    )


def test_a_run_folder_under_a_file_is_refused_at_the_start(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes").write_text("a file where the run's parent folder would go")
    run = tmp_path / "notes" / "run"
    assert train_main(tiny_args(corpus, run)) == 2
    assert error_line(capsys.readouterr().err) == f"error: cannot write the run folder {run}: not a directory"


def test_a_read_only_run_folder_is_refused_at_the_start(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o500)
    try:
        if os.access(run, os.W_OK):
            pytest.skip("this user (root) may write a folder of mode 0o500; the patched tests above stand in")
        assert train_main(tiny_args(corpus, run)) == 2
    finally:
        run.chmod(0o700)
    assert (
        error_line(capsys.readouterr().err) == f"error: cannot write the run folder {run}: permission denied"
    )


def test_a_run_whose_checkpoints_will_not_fit_says_so_before_its_first_step(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    free = {"bytes": 10**12}
    monkeypatch.setattr("minigpt.training.callbacks.checkpoints.free_space", lambda path: free["bytes"])
    args = ("--trainer.max_steps", "4", "--trainer.val_check_interval", "4")
    with caplog.at_level("WARNING", logger="minigpt"):
        assert train_main(tiny_args(corpus, tmp_path / "roomy", *args)) == 0
    assert "the first save will fail" not in caplog.text
    size = (tmp_path / "roomy" / "checkpoints" / "last.ckpt").stat().st_size
    caplog.clear()
    free["bytes"] = 2 * size  # best.ckpt and last.ckpt fit, with no room for a save's new file
    with caplog.at_level("WARNING", logger="minigpt"):
        train_main(tiny_args(corpus, tmp_path / "tight", *args))
    (warning,) = [r.getMessage() for r in caplog.records if "the first save will fail" in r.getMessage()]
    estimate = float(re.search(r"\(2 of about ([\d.]+) MB", warning)[1]) * 1e6
    assert abs(estimate - size) <= 0.15 * size, (estimate, size)  # the estimate is the checkpoint's size


@pytest.mark.slow
def test_a_full_disk_under_ddp_ends_every_rank_in_one_line_each(corpus: Path, tmp_path: Path) -> None:
    # Rank 0 writes the checkpoints; its third (best.ckpt at step 8) meets a full disk while rank 1
    # waits for it. Rank 1 must not wait for DDP's timeout, nor print the collective's traceback.
    full_disk = (f"--trainer.callbacks+={FAULTS}.FullDiskAtSave", "--trainer.callbacks.nth=3")
    launched = launch(corpus, tmp_path, *DDP, *VALIDATED, *full_disk, timeout=120)
    stderr = launched.result.stderr
    assert launched.result.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    checkpoints = launched.run / "checkpoints"
    rank_0, rank_1 = sorted(errors)
    assert rank_0.startswith(f"error: cannot write checkpoint {checkpoints / 'best.ckpt'}: no space left")
    assert rank_0.endswith("resume from it with the same command and --ckpt_path last")
    assert rank_1 == "error: rank 1 stopped: another process of the run ended"
    assert torch.load(checkpoints / "best.ckpt", weights_only=True)["global_step"] == 4
