"""The shared causal mask: one tensor per size and device, for as long as something holds it."""

from __future__ import annotations

import gc

import torch

from minigpt.model.mask import _MASKS, causal_mask


def test_one_mask_per_size_and_device_while_held() -> None:
    mask = causal_mask(37, "cpu")
    assert causal_mask(37) is mask and causal_mask(38) is not mask
    assert mask.dtype == torch.bool and torch.equal(mask, torch.ones(37, 37, dtype=torch.bool).triu(1))
    del mask
    gc.collect()
    assert (37, torch.device("cpu")) not in _MASKS  # nothing holds it: the registry lets it go
