"""What several test modules of this folder, and others, share."""

from __future__ import annotations

import csv
import shutil
import string
from pathlib import Path
from typing import Any

import torch

from minigpt.data.tokenizer import CharTokenizer
from minigpt.training.muon import Muon


def read_metrics(run: Path) -> list[dict[str, str]]:
    files = sorted(run.glob("csv/version_*/metrics.csv"))
    assert files, f"no metrics.csv under {run}"
    with open(files[-1]) as f:
        return list(csv.DictReader(f))


CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
"""A headless browser to render the report in (Debian: `apt-get install chromium`)."""


def step_both(theirs: list, ours: list, torch_muon: torch.optim.Optimizer, our_muon: Muon) -> None:
    grads = [torch.randn_like(p) for p in theirs]
    for p, q, g in zip(theirs, ours, grads, strict=True):
        p.grad, q.grad = g.clone(), g.clone()
    torch_muon.step()
    our_muon.step()


def with_singular_values(rows: int, cols: int, values: torch.Tensor) -> torch.Tensor:
    u, _ = torch.linalg.qr(torch.randn(rows, len(values)))
    v, _ = torch.linalg.qr(torch.randn(cols, len(values)))
    return u @ torch.diag(values) @ v.T


PRODUCTS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm)


class RecordMatmulDtypes(torch.utils._python_dispatch.TorchDispatchMode):
    """The dtypes of the matrix products run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func.overloadpacket in PRODUCTS:
            self.dtypes.add(args[0].dtype)
        return func(*args, **(kwargs or {}))


def step_losses(run: Path) -> dict[int, str]:
    """The training loss logged at each step, as written; a resumed run's rows replace earlier ones."""
    losses: dict[int, str] = {}
    for path in sorted(run.glob("csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:])):
        with open(path, newline="") as f:
            losses |= {int(row["step"]): row["train_loss"] for row in csv.DictReader(f) if row["train_loss"]}
    return losses


def last_checkpoint(run: Path) -> dict[str, Any]:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)


def assert_identical(resumed: Any, straight: Any, where: str) -> None:
    """Equal tensors bit for bit, and equal everything else, through nested dicts and lists."""
    if isinstance(straight, torch.Tensor):
        assert torch.equal(resumed, straight), where
    elif isinstance(straight, dict):
        assert resumed.keys() == straight.keys(), where
        for key in straight:
            assert_identical(resumed[key], straight[key], f"{where}/{key}")
    elif isinstance(straight, list | tuple):
        assert len(resumed) == len(straight), where
        for i, (a, b) in enumerate(zip(resumed, straight, strict=True)):
            assert_identical(a, b, f"{where}/{i}")
    else:
        assert resumed == straight, where


BASE = CharTokenizer.from_texts([string.printable])


def sft_args(files: tuple[Path, Path], run: Path, *extra: str) -> list[str]:
    weights, chats = files
    return [
        "--config",
        "sft.yaml",
        "--model.init_from",
        str(weights),
        "--data.conversations.source",
        str(chats),
        "--data.conversations.split",
        "train",
        "--data.conversations.val_fraction",
        "0.1",
        "--data.conversations.batch_size",
        "3",
        "--data.conversations.pack",
        "true",  # 36 conversations in 11 windows: 3 steps an epoch, so step 4 is in mid-epoch
        "--model.optim.lr",
        "3e-3",
        "--model.optim.warmup_steps",
        "10",  # every step warms up: a run that ends at step 4 steps as the longer one did
        "--trainer.max_steps",
        "6",
        "--trainer.val_check_interval",
        "3",
        "--trainer.log_every_n_steps",
        "1",
        "--trainer.precision",
        "32-true",
        "--trainer.accelerator",
        "cpu",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.default_root_dir",
        str(run),
        *extra,
    ]
