"""Starting from trained weights: the context may shrink, with or without a position table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from minigpt.checkpoints import save_safetensors
from minigpt.checkpoints.pretrained import load_pretrained, open_pretrained, pretrained_config
from minigpt.data import CharTokenizer
from minigpt.model import GPT, GPTConfig

CHARS = " abcdefghijklmnopqrstuvwxyz"


@pytest.mark.parametrize("position_embedding", ["learned", "rope"])
def test_a_shorter_context_keeps_the_weights_and_the_first_positions(
    position_embedding: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=27, context_length=16, n_layer=1, n_head=2, n_embd=8, position_embedding=position_embedding
    )
    trained = GPT(config).eval()
    save_safetensors(trained, CharTokenizer(CHARS), tmp_path / "m.safetensors")
    model_file, weights, _ = open_pretrained(tmp_path / "m.safetensors")
    shorter = pretrained_config(weights, replace(config, context_length=8), {"context_length"}, "m")
    model = GPT(shorter).eval()
    load_pretrained(model, model_file, weights)
    ids = torch.randint(0, 27, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), trained(ids))  # the first 8 positions compute the same
