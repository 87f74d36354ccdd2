import math

import pytest
import torch
from torch.testing import assert_close

from minigpt.model import KVCache, MultiHeadAttention

from .helpers import EXPECTED, INPUTS

# "Your journey starts with one step", 3-d embeddings from the reference text.


def naive_attention(mha: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Head by head, token by token, with Python loops: no masking tricks to get wrong."""
    b, t, _ = x.shape
    q, k, v = mha.W_query(x), mha.W_key(x), mha.W_value(x)
    hs = mha.head_dim
    out = torch.zeros(b, t, mha.d_out)
    for h in range(mha.num_heads):
        cols = slice(h * hs, (h + 1) * hs)
        for i in range(t):
            scores = torch.stack([(q[:, i, cols] * k[:, j, cols]).sum(-1) for j in range(i + 1)], -1)
            weights = torch.softmax(scores / math.sqrt(hs), dim=-1)  # (B, i+1)
            out[:, i, cols] = (weights.unsqueeze(-1) * v[:, : i + 1, cols]).sum(1)
    return mha.out_proj(out)


PATHS = ["sdpa", "explicit"]


@pytest.mark.parametrize("attention", PATHS)
@pytest.mark.parametrize("return_weights", [False, True])
def test_reproduces_the_worked_example(return_weights: bool, attention: str) -> None:
    batch = torch.stack((INPUTS, INPUTS), dim=0)
    torch.manual_seed(123)
    mha = MultiHeadAttention(3, 2, 6, 0.0, num_heads=2, attention=attention)
    out = mha(batch, return_weights=return_weights)
    out = out[0] if return_weights else out
    assert out.shape == (2, 6, 2)
    for row in out:
        assert_close(row, EXPECTED, atol=5e-5, rtol=0)


def test_both_paths_match_a_naive_reference() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 24, 10, 0.0, num_heads=3, qkv_bias=True)
    x = torch.randn(2, 10, 16)
    reference = naive_attention(mha, x)
    for attention in PATHS:
        mha.attention = attention
        assert_close(mha(x), reference)
    assert_close(mha(x, return_weights=True)[0], reference)


def test_stacked_projection_trains_the_three_layers_as_if_apart() -> None:
    # With gradients on, W_query, W_key and W_value run as one stacked matmul; without, apart.
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 24, 10, 0.0, num_heads=3, qkv_bias=True, attention="explicit")
    x = torch.randn(2, 10, 16, requires_grad=True)
    inputs = [x, *mha.parameters()]
    stacked = torch.autograd.grad(mha(x).square().sum(), inputs)
    apart = torch.autograd.grad(naive_attention(mha, x).square().sum(), inputs)
    for a, b in zip(stacked, apart, strict=True):
        assert_close(a, b)
    with torch.no_grad():
        assert_close(mha(x), naive_attention(mha, x))


def test_auto_takes_the_explicit_path_on_cpu_for_training_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k)
    )
    x = torch.randn(1, 5, 8)
    MultiHeadAttention(8, 8, 6, 0.0, num_heads=2)(x)
    assert calls == []
    MultiHeadAttention(8, 8, 6, 0.0, num_heads=2, attention="sdpa")(x)
    assert calls == [1]
    MultiHeadAttention(8, 8, 6, 0.0, num_heads=2)(x[:, :1])  # a decoding step
    assert calls == [1, 1]
    with torch.no_grad():  # validation, generation: no backward pass to slow down
        MultiHeadAttention(8, 8, 6, 0.0, num_heads=2)(x)
    assert calls == [1, 1, 1]
    with pytest.raises(ValueError, match="attention must be one of auto, sdpa, explicit"):
        MultiHeadAttention(8, 8, 6, 0.0, num_heads=2, attention="flash")


def test_fused_and_explicit_paths_agree_in_outputs_and_gradients() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 32, 16, 0.0, num_heads=4, attention="sdpa")
    x = torch.randn(3, 16, 32, requires_grad=True)
    fused = mha(x)
    grads_fused = torch.autograd.grad(fused.square().sum(), [x, *mha.parameters()])
    explicit, _ = mha(x, return_weights=True)
    grads_explicit = torch.autograd.grad(explicit.square().sum(), [x, *mha.parameters()])
    assert_close(fused, explicit)
    for a, b in zip(grads_fused, grads_explicit, strict=True):
        assert_close(a, b)


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    return ((actual.float() - reference).abs().max() / reference.abs().max()).item()


def test_fused_and_explicit_paths_agree_under_bf16_autocast() -> None:
    """bf16-mixed training (small.yaml) runs the explicit path on CPU and SDPA on GPUs: both must
    give the fp32 result to bf16's precision (8 bits: 0.4% per rounding), forward and backward."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 32, 16, 0.0, num_heads=4, attention="sdpa")
    x = torch.randn(3, 16, 32, requires_grad=True)
    inputs = [x, *mha.parameters()]
    reference, _ = mha(x, return_weights=True)  # fp32, explicit
    reference_grads = torch.autograd.grad(reference.square().sum(), inputs)
    outputs = []
    for return_weights in (False, True):  # SDPA, then explicit
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = mha(x, return_weights=return_weights)
        out = out[0] if return_weights else out
        assert out.dtype == torch.bfloat16
        assert relative_error(out, reference) < 0.01
        grads = torch.autograd.grad(out.float().square().sum(), inputs)
        assert max(relative_error(g, r) for g, r in zip(grads, reference_grads, strict=True)) < 0.03
        outputs.append(out)
    assert relative_error(outputs[0], outputs[1].float()) < 0.01


def test_weights_are_causal_and_normalised() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 8, 12, 0.0, num_heads=2)
    _, weights = mha(torch.randn(1, 7, 8), return_weights=True)
    assert weights.shape == (1, 2, 7, 7)
    assert torch.all(weights.triu(diagonal=1) == 0)
    assert_close(weights.sum(-1), torch.ones(1, 2, 7))


def test_future_tokens_do_not_change_past_outputs() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 8, 12, 0.0, num_heads=2)
    x = torch.randn(1, 9, 8)
    changed = x.clone()
    changed[:, 5:] = torch.randn(1, 4, 8)
    assert_close(mha(x)[:, :5], mha(changed)[:, :5])
    assert not torch.allclose(mha(x)[:, 5:], mha(changed)[:, 5:])


def test_mask_is_boolean_and_not_in_the_state_dict() -> None:
    mha = MultiHeadAttention(4, 4, 5, 0.0, num_heads=2)
    assert mha.mask.dtype == torch.bool
    assert torch.equal(mha.mask, torch.ones(5, 5, dtype=torch.bool).triu(1))
    assert "mask" not in mha.state_dict()
    # Weights trained with one context length load into a model with another.
    MultiHeadAttention(4, 4, 9, 0.0, num_heads=2).load_state_dict(mha.state_dict())


def test_dropout_acts_on_attention_weights_only_in_training() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 8, 6, 0.5, num_heads=2)
    x = torch.randn(2, 6, 8)
    _, weights = mha(x, return_weights=True)
    visible = torch.ones(6, 6, dtype=torch.bool).tril()
    assert (weights[..., visible] == 0).any()  # some weights the mask allows were dropped
    assert weights.max() > 1.0  # survivors are rescaled by 1 / (1 - p)
    assert not torch.allclose(mha(x), mha(x))
    mha.eval()
    assert_close(mha(x), mha(x))
    assert_close(mha(x), mha(x, return_weights=True)[0])


@pytest.mark.parametrize("attention", PATHS)
@pytest.mark.parametrize("chunks", [[6], [1, 1, 1, 1, 1, 1], [3, 1, 2], [2, 4]])
def test_kv_cache_continues_the_sequence_exactly(chunks: list[int], attention: str) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 8, 6, 0.0, num_heads=2, attention=attention).eval()
    x = torch.randn(2, 6, 8)
    cache = KVCache(2, 2, 6, 4)
    pieces, start = [], 0
    for n in chunks:
        pieces.append(mha(x[:, start : start + n], kv_cache=cache))
        start += n
    assert_close(torch.cat(pieces, dim=1), mha(x))
    assert cache.length == 6


def test_too_long_input_is_rejected() -> None:
    mha = MultiHeadAttention(4, 4, 5, 0.0, num_heads=2)
    with pytest.raises(ValueError, match="exceeds context length 5"):
        mha(torch.randn(1, 6, 4))


def test_heads_must_divide_width() -> None:
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(4, 6, 5, 0.0, num_heads=4)
