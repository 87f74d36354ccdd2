"""Bits per byte, summed in one place: validation (`training/lit.py`), `score_text` (`text.py`) and
`benchmarks/tokenizer_bpb.py` all add their targets to a `BitsPerByte`."""

from __future__ import annotations

import math

import numpy as np
import torch
from torchmetrics import Metric

from minigpt.data.chat.conversations import IGNORE_INDEX


class BitsPerByte(Metric):
    """Bits per byte and the mean loss per token of next-token targets, from sums over every batch
    and every process.

    Bits per byte compare models whatever their tokenizer: the summed loss of the targets, in
    bits, over the UTF-8 bytes those targets spell. End-of-text targets spell no bytes (the token
    table gives them 0), so they are left out of both the loss summed for bits per byte and the
    bytes it is divided by: a tokenizer with an end-of-text token is scored on the same text, and
    on nothing else, as one without. The loss per token counts every target, end-of-text too, as
    the training loss does.

    Each process sums, in float64, the loss of every target, their count, the loss of the targets
    that spell text and their bytes; `compute` adds those sums over the processes and divides
    once, so batches and processes of any size weigh by their targets and bytes.
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    nats: torch.Tensor
    targets: torch.Tensor
    text_nats: torch.Tensor
    bytes: torch.Tensor

    def __init__(self, token_bytes: torch.Tensor | np.ndarray, **kwargs) -> None:
        """
        Args:
            token_bytes: (n_vocab,) the UTF-8 bytes each token id stands for, 0 for end-of-text
                (`Tokenizer.byte_lengths()`).
            kwargs: torchmetrics' `Metric` options, e.g. `sync_on_compute=False` where each process
                scores the same text.
        """
        super().__init__(**kwargs)
        # A plain tensor, not a buffer: a buffer would be broadcast with the model's under DDP.
        self._token_bytes = torch.as_tensor(token_bytes, dtype=torch.long)
        for name in ("nats", "targets", "text_nats", "bytes"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, losses: torch.Tensor, targets: torch.Tensor) -> None:
        """Add targets to the sums.

        Args:
            losses: Each target's loss in nats, any shape; summed in its own dtype.
            targets: The target token ids, as many as `losses`; IGNORE_INDEX (-100) leaves its
                target out of every sum, as cross-entropy leaves it out of the loss.
        """
        if self._token_bytes.device != targets.device:
            self._token_bytes = self._token_bytes.to(targets.device)
        kept = targets.flatten() != IGNORE_INDEX  # a chat's turns the model does not learn to write
        losses, targets = losses.flatten()[kept], targets.flatten()[kept]
        nbytes = self._token_bytes[targets]
        self.nats += losses.sum().double()
        self.targets += losses.numel()
        self.text_nats += losses[nbytes > 0].sum().double()
        self.bytes += nbytes.sum().double()

    def compute(self) -> dict[str, torch.Tensor]:
        """`bpb` (bits per byte), `loss` (mean nats per target), and the `targets` and `bytes`
        they are over; float64, NaN where there is nothing to divide by."""
        return {
            "bpb": self.text_nats / (math.log(2) * self.bytes),
            "loss": self.nats / self.targets,
            "targets": self.targets,
            "bytes": self.bytes,
        }
