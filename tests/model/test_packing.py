"""Several sequences packed into one row attend each to itself alone: each gets the logits it gets
run alone, in both recipes' positions (rotary, a learned table) and both attention paths, and no
token of one changes another's."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.testing import assert_close

from minigpt.model import GPT, GPTConfig
from minigpt.model.fast import normalise_and_rotate, normalise_and_rotate_reference
from minigpt.model.rotary import RotaryEmbedding

T = 24
RECIPES = {
    "modern": GPTConfig(
        vocab_size=64,
        context_length=T,
        n_layer=2,
        n_head=2,
        n_embd=32,
        position_embedding="rope",
        qk_norm=True,
        norm="rmsnorm",
        activation="relu2",
        bias=False,
    ),
    "gpt2": GPTConfig(vocab_size=64, context_length=T, n_layer=2, n_head=2, n_embd=32, qkv_bias=True),
}
LENGTHS = [(7, 5, 9), (12, 3, 2, 4)]
"""Each row's sequences; the first row ends with 3 ids of padding, the second with 3 too."""


def packed_rows(sequences: list[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids, segments and positions (B, T) of rows holding `sequences` back to back, each row's
    padding a segment of its own, as PackedConversationWindows lays them out."""
    rows = [], [], []
    for row in sequences:
        padding = torch.zeros(T - sum(len(s) for s in row), dtype=torch.int64)
        parts = [*row, padding]
        rows[0].append(torch.cat(parts))
        rows[1].append(torch.cat([torch.full((len(p),), i) for i, p in enumerate(parts)]))
        rows[2].append(torch.cat([torch.arange(len(p)) for p in parts]))
    return tuple(torch.stack(r) for r in rows)


def random_sequences(seed: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randint(0, 64, (n,), generator=generator) for n in row] for row in LENGTHS]


@pytest.mark.parametrize("attention", ["explicit", "sdpa"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_each_packed_sequence_gets_the_logits_it_gets_alone(recipe: str, attention: str) -> None:
    torch.manual_seed(0)
    model = GPT(replace(RECIPES[recipe], attention=attention))
    sequences = random_sequences(1)
    idx, segments, positions = packed_rows(sequences)
    logits = model(idx, segments=segments, positions=positions)  # gradients on: the training path
    for b, row in enumerate(sequences):
        start = 0
        for sequence in row:
            alone = model(sequence[None])[0]
            assert_close(logits[b, start : start + len(sequence)], alone, atol=2e-6, rtol=1e-5)
            start += len(sequence)
    # The other path computes the same packed logits.
    other = GPT(replace(RECIPES[recipe], attention={"explicit": "sdpa", "sdpa": "explicit"}[attention]))
    other.load_state_dict(model.state_dict())
    assert_close(other(idx, segments=segments, positions=positions), logits, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("attention", ["explicit", "sdpa"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_no_token_attends_across_sequences(recipe: str, attention: str) -> None:
    """Every other sequence of a row changed, the logits of the one kept are bit for bit the same;
    and its gradient reaches no other sequence's embedding."""
    torch.manual_seed(0)
    model = GPT(replace(RECIPES[recipe], attention=attention)).eval()
    first, second = random_sequences(1), random_sequences(2)
    idx, segments, positions = packed_rows(first)
    kept = segments == 1  # each row's second sequence, the others and the padding replaced
    changed = torch.where(kept, idx, packed_rows(second)[0])
    assert (changed != idx)[~kept].any()
    logits = model(idx, segments=segments, positions=positions)
    assert torch.equal(model(changed, segments=segments, positions=positions)[kept], logits[kept])

    embedded = model.transformer.wte(idx).detach().requires_grad_()
    model.transformer.wte.register_forward_hook(lambda module, args, output: embedded)  # its gradient
    model(idx, segments=segments, positions=positions)[kept].sum().backward()
    reached = embedded.grad.abs().sum(-1) > 0  # (B, T)
    assert reached[kept].any() and not reached[~kept].any()


def test_the_rotation_at_given_positions_is_each_tokens_own() -> None:
    """RoPE makes a query-key product depend on their distance alone, so the logits hardly tell
    whether each sequence counts from 0; the rotation itself must, and its fast path with it."""
    rotary = RotaryEmbedding(8, T)
    x = torch.randn(2, 2, 3, 5, 8, requires_grad=True)  # (queries and keys, B, nh, T, hs)
    positions = torch.tensor([[4, 0, 1, 2, 0], [9, 10, 0, 1, 2]])
    rotated = rotary(x, 0, positions)
    for b in range(2):
        for t in range(5):
            alone = rotary(x[:, b, :, t : t + 1], int(positions[b, t]))
            assert_close(rotated[:, b, :, t : t + 1], alone)
    fast, reference = (
        normalise_and_rotate(x, rotary, 0, positions),
        normalise_and_rotate_reference(x, rotary, 0, positions),
    )
    assert_close(fast, reference)
    grad = torch.randn_like(x)
    assert_close(torch.autograd.grad(fast, x, grad)[0], torch.autograd.grad(reference, x, grad)[0])


@pytest.mark.parametrize("recipe", RECIPES)
def test_one_segment_at_the_plain_positions_is_the_plain_forward(recipe: str) -> None:
    torch.manual_seed(0)
    model = GPT(RECIPES[recipe])
    idx = torch.randint(0, 64, (2, T))
    positions = torch.arange(T).expand(2, T)
    packed = model(idx, segments=torch.zeros_like(idx), positions=positions)
    assert_close(packed, model(idx), atol=2e-6, rtol=1e-5)


def test_segments_need_positions_and_no_cache() -> None:
    model = GPT(RECIPES["modern"])
    idx = torch.zeros(1, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="give both or neither"):
        model(idx, segments=torch.zeros_like(idx))
    with pytest.raises(ValueError, match="cannot continue a KV cache"):
        model(idx, model.new_kv_caches(1), segments=torch.zeros_like(idx), positions=torch.zeros_like(idx))
    with pytest.raises(ValueError, match=r"must be shaped as the ids \(1, 4\)"):
        model(idx, segments=torch.zeros(1, 3, dtype=torch.int64), positions=torch.zeros_like(idx))
