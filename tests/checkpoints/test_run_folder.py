"""A run folder names its best checkpoint, not its latest one."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.testing import assert_close

from minigpt.checkpoints import load_model
from minigpt.model import GPT

from .helpers import CONFIG, write_checkpoint


def test_a_run_folder_prefers_best_over_last(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    torch.manual_seed(1)
    best = GPT(CONFIG).eval()
    torch.manual_seed(2)
    last = GPT(CONFIG).eval()
    # Written best first: a loader taking the newest file would pick last.
    write_checkpoint(tmp_path / "checkpoints" / "best.ckpt", best)
    write_checkpoint(tmp_path / "checkpoints" / "last.ckpt", last)
    ids = torch.tensor([[1, 2, 3, 4]])
    loaded, _ = load_model(tmp_path)
    assert_close(loaded(ids), best(ids))
    assert not torch.allclose(loaded(ids), last(ids))
    # Without a best checkpoint (no validation yet), the latest one.
    (tmp_path / "checkpoints" / "best.ckpt").unlink()
    assert_close(load_model(tmp_path)[0](ids), last(ids))
