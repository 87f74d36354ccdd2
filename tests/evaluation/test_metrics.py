"""BitsPerByte against a computation by hand on fixed losses and byte counts, and its sums merged
from two processes against one process that saw every target."""

from __future__ import annotations

import math

import pytest
import torch

from minigpt.evaluation.metrics import BitsPerByte

TOKEN_BYTES = torch.tensor([0, 1, 2, 4])
"""Token 0 is end-of-text (no bytes); tokens 1-3 spell 1, 2 and 4 bytes."""


def test_bits_per_byte_leaves_end_of_text_out_and_the_loss_keeps_it() -> None:
    metric = BitsPerByte(TOKEN_BYTES)
    metric.update(torch.tensor([[0.5, 2.0], [1.0, 3.0]]), torch.tensor([[1, 0], [3, 2]]))
    metric.update(torch.tensor([4.0]), torch.tensor([1]))
    score = metric.compute()
    # Text targets 1, 3, 2, 1: losses 0.5 + 1 + 3 + 4 nats over 1 + 4 + 2 + 1 bytes; the
    # end-of-text target's 2 nats count in the loss per token only.
    assert score["bpb"].item() == pytest.approx(8.5 / (math.log(2) * 8))
    assert score["loss"].item() == pytest.approx(10.5 / 5)
    assert (score["targets"].item(), score["bytes"].item()) == (5, 8)


def test_ignored_targets_count_in_nothing() -> None:
    """A chat's targets outside the assistant's turns are -100 (their loss 0): no id is looked up
    for them, and they add to neither sum."""
    metric = BitsPerByte(TOKEN_BYTES)
    metric.update(torch.tensor([[0.0, 2.0], [1.0, 0.0]]), torch.tensor([[-100, 2], [3, -100]]))
    score = metric.compute()
    assert (score["targets"].item(), score["bytes"].item()) == (2, 6)
    assert score["loss"].item() == pytest.approx(3.0 / 2)
    assert score["bpb"].item() == pytest.approx(3.0 / (math.log(2) * 6))


def scored(losses: torch.Tensor, targets: torch.Tensor) -> BitsPerByte:
    metric = BitsPerByte(TOKEN_BYTES)
    for row_losses, row_targets in zip(losses, targets, strict=True):  # one batch a row
        metric.update(row_losses, row_targets)
    return metric


def test_two_processes_merged_give_the_sums_of_one() -> None:
    torch.manual_seed(0)
    targets = torch.randint(len(TOKEN_BYTES), (7, 16))
    losses = torch.rand(7, 16) * 5
    whole = scored(losses, targets).compute()
    # Ranks of unequal shares (2 and 5 batches): the mean of their two figures would be wrong.
    parts = [scored(losses[:2], targets[:2]).compute(), scored(losses[2:], targets[2:]).compute()]
    mean_of_two = (parts[0]["bpb"] + parts[1]["bpb"]) / 2
    assert abs(mean_of_two - whole["bpb"]) > 1e-3
    first = scored(losses[:2], targets[:2])
    first.merge_state(scored(losses[2:], targets[2:]))  # what compute's reduction over ranks adds
    merged = first.compute()
    assert merged.keys() == whole.keys()
    for name in whole:
        torch.testing.assert_close(merged[name], whole[name])


def test_with_nothing_scored_there_is_nothing_to_divide() -> None:
    with pytest.warns(UserWarning):  # torchmetrics: compute before any update
        score = BitsPerByte(TOKEN_BYTES).compute()
    assert math.isnan(score["loss"].item()) and math.isnan(score["bpb"].item())
