"""A training step on packed conversations is the step on the same conversations one per window:
the same loss (the mean over the assistant's tokens of the batch) and the same gradients, with
every weight training or LoRA's adapters."""

from __future__ import annotations

import string

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from minigpt.data.chat.conversations import (
    ConversationWindows,
    PackedConversationWindows,
    encode_conversations,
)
from minigpt.data.chat.instructions import Conversation
from minigpt.data.chat.template import ChatEncoder
from minigpt.data.tokenizer import CharTokenizer, with_chat_tokens
from minigpt.model import GPT, GPTConfig
from minigpt.training.config import LoRAConfig
from minigpt.training.lit import LitGPT
from minigpt.training.lora import add_adapters

T = 64
TOKENIZER = with_chat_tokens(CharTokenizer.from_texts([string.printable]))
RECIPE = GPTConfig(
    vocab_size=TOKENIZER.n_vocab,
    context_length=T,
    n_layer=2,
    n_head=2,
    n_embd=32,
    position_embedding="rope",
    qk_norm=True,
    activation="relu2",
)


def batches() -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Ten conversations as windows of one each, and packed."""
    chats = [
        Conversation(
            f"row {i}",
            [{"role": "user", "content": f"{i} + {i}?"}, {"role": "assistant", "content": str(2 * i)}],
        )
        for i in range(10)
    ]
    examples = encode_conversations(chats, ChatEncoder(TOKENIZER), T)
    packed = PackedConversationWindows(examples, T, pad_id=TOKENIZER.end_id, seed=0)
    assert len(packed) < len(examples) / 2

    def stacked(windows: ConversationWindows | PackedConversationWindows) -> tuple[torch.Tensor, ...]:
        return tuple(map(torch.stack, zip(*windows, strict=True)))

    return stacked(ConversationWindows(examples, T, pad_id=TOKENIZER.end_id)), stacked(packed)


@pytest.mark.parametrize("lora", [None, LoRAConfig(rank=4, dropout=0.0)], ids=["full", "lora"])
def test_a_packed_step_is_the_step_on_the_conversations_one_per_window(lora: LoRAConfig | None) -> None:
    torch.manual_seed(0)
    lit = LitGPT(RECIPE, lora=lora)
    lit.model = GPT(RECIPE)
    if lora is not None:
        add_adapters(lit.model, lora)
        for name, parameter in lit.model.named_parameters():
            if ".lora_B." in name:
                nn.init.normal_(parameter, std=0.5)  # B starts at zero: make the adapters count
    trained = [p for p in lit.model.parameters() if p.requires_grad]
    losses, gradients = [], []
    for batch in batches():
        loss = lit.loss(*batch)
        losses.append(loss.detach())
        gradients.append(torch.autograd.grad(loss, trained))
    assert_close(losses[1], losses[0], atol=1e-6, rtol=1e-6)
    for packed, alone in zip(gradients[1], gradients[0], strict=True):
        assert_close(packed, alone, atol=1e-6, rtol=1e-5)
