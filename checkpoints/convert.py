"""Pure state-dict conversions between the layouts model files use and `minigpt.model.GPT`'s.

Functions of tensors only (no files, no Lightning), so each format reader is a file parser plus
one of these, and each conversion can be tested on its own.
"""

from __future__ import annotations

import torch

LIGHTNING_PREFIX = "model."
"""LitGPT holds the network as `self.model`, so its state dict keys carry this prefix."""


def from_lightning(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The GPT's own entries of a LightningModule state dict, without the `model.` prefix."""
    n = len(LIGHTNING_PREFIX)
    return {key[n:]: value for key, value in state_dict.items() if key.startswith(LIGHTNING_PREFIX)}
