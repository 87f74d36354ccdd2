"""What several test modules of this folder, and others, share."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from minigpt.data import CharTokenizer
from minigpt.model import GPT, GPTConfig

CHARS = " abcdefghijklmnopqrstuvwxyz"


CONFIG = GPTConfig(vocab_size=len(CHARS), context_length=16, n_layer=1, n_head=2, n_embd=16)


def write_checkpoint(path: Path, model: GPT, **meta_overrides) -> Path:
    """A checkpoint laid out as training writes it."""
    meta = {"gpt": asdict(model.config), "tokenizer": CharTokenizer(CHARS).spec(), **meta_overrides}
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "minigpt": meta, "global_step": 3}, path)
    return path


@pytest.fixture
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG).eval()


HF_CHARS = "\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def randomize(model: torch.nn.Module) -> None:
    """Every parameter drawn at a scale where a mix-up shows: LayerNorms and biases not at their
    initial 1 and 0, and MLP inputs large enough that the two GELUs differ by far more than the
    tolerance."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(0.0, 0.5 if ".ln_" in name or name.endswith("bias") or "c_fc" in name else 0.1)


def hf_greedy(model, ids: torch.Tensor, n: int, **options) -> torch.Tensor:
    return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, **options)
