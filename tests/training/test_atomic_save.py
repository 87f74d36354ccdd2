"""A kill during a checkpoint save never corrupts the checkpoint that was there before."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minigpt.training.callbacks.checkpoints import AtomicCheckpointIO

CHILD = """
import sys, torch
from minigpt.training.callbacks.checkpoints import AtomicCheckpointIO
# About 400 MB: long enough to be killed in the middle of writing it.
AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(100_000_000)}}, sys.argv[1])
"""


def test_a_save_replaces_the_file_in_one_step(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1}, path)
    AtomicCheckpointIO().save_checkpoint({"step": 2}, path)
    assert torch.load(path, weights_only=True) == {"step": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left behind


def test_a_failed_save_leaves_the_old_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1}, path)

    def disk_full(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError):
        AtomicCheckpointIO().save_checkpoint({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"step": 1}


@pytest.mark.slow
def test_sigkill_during_a_save_leaves_the_old_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1}, path)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)])
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size > 1_000_000 for p in tmp_path.glob(".last.ckpt.*tmp")):
        assert child.poll() is None, "the save finished before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert torch.load(path, weights_only=True) == {"step": 1}
