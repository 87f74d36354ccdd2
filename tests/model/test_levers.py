"""The architecture settings the recipes choose between: rotary positions, QK-norm, RMSNorm,
squared ReLU, zero-init projections. Each keeps causality, cache parity and SDPA == explicit."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from minigpt.model import GPT, ConfigError, GPTConfig
from minigpt.model.attention import (
    _NormaliseRotate,
    _one_node,
    _RMSNormalise,
    _rotate,
    normalise_and_rotate,
    rms_normalise,
)
from minigpt.model.generation import generate
from minigpt.model.gpt import parameter_count
from minigpt.model.rotary import RotaryEmbedding, swap_halves

BASE = dict(vocab_size=50, context_length=16, n_layer=2, n_head=2, n_embd=16)
LEVERS = {
    "rope": dict(position_embedding="rope"),
    "qk_norm": dict(qk_norm=True),
    "rmsnorm": dict(norm="rmsnorm"),
    "relu2": dict(activation="relu2"),
    "zero_init": dict(zero_init_proj=True),
    "all": dict(
        position_embedding="rope", qk_norm=True, norm="rmsnorm", activation="relu2", zero_init_proj=True
    ),
}


def build(**changes) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**BASE, **changes})).eval()
    with torch.no_grad():  # zero-initialised projections would hide every other difference
        for block in model.transformer.h:
            for proj in (block.attn.out_proj, block.mlp.c_proj):
                if not proj.weight.any():
                    proj.weight.normal_(0.0, 0.2)
    return model


@pytest.mark.parametrize("lever", LEVERS, ids=str)
def test_a_future_token_never_changes_past_logits(lever: str) -> None:
    model = build(**LEVERS[lever])
    ids = torch.randint(0, 50, (1, 12))
    changed = ids.clone()
    changed[0, 8] = (ids[0, 8] + 1) % 50
    with torch.no_grad():
        assert_close(model(ids)[:, :8], model(changed)[:, :8])
        assert not torch.allclose(model(ids)[:, 8:], model(changed)[:, 8:])


@pytest.mark.parametrize("lever", LEVERS, ids=str)
def test_cached_generation_and_sdpa_agree_with_the_explicit_uncached_path(lever: str) -> None:
    explicit = build(**LEVERS[lever], attention="explicit")
    sdpa = build(**LEVERS[lever], attention="sdpa")
    ids = torch.randint(0, 50, (2, 10))
    with torch.no_grad():
        assert_close(explicit(ids), sdpa(ids), rtol=1e-5, atol=1e-5)
    prompt = ids[:, :4]
    cached = generate(explicit, prompt, 20, temperature=0.0)  # slides past the context, too
    uncached = generate(explicit, prompt, 20, temperature=0.0, use_cache=False)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("lever", LEVERS, ids=str)
def test_parameter_count_matches_the_built_model(lever: str) -> None:
    model = build(**LEVERS[lever])
    assert parameter_count(model.config) == model.num_parameters(non_embedding=False)


def test_rotary_attention_scores_depend_only_on_the_distance_between_positions() -> None:
    rotary = RotaryEmbedding(head_dim=8, context_length=32)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    score = (rotary(q, 5) * rotary(k, 2)).sum()
    shifted = (rotary(q, 20) * rotary(k, 17)).sum()
    other_distance = (rotary(q, 20) * rotary(k, 12)).sum()
    assert_close(score, shifted, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(score, other_distance)
    assert_close(rotary(q, 0), q)  # position 0 is not rotated
    assert_close(rotary(q, 7).norm(), q.norm())  # a rotation keeps lengths


def test_qk_norm_and_rotation_in_one_node_match_the_two_apart() -> None:
    """The fp32 node that normalises and rotates together (forward, and a backward written out)
    against F.rms_norm then the rotation through autograd, at a start past 0, a zero vector and
    a non-contiguous input (the projection's view) included; and its gradient against finite
    differences in float64."""
    torch.manual_seed(0)
    rotary = RotaryEmbedding(head_dim=16, context_length=32)
    projected = torch.randn(2, 8, 3, 4, 16) * 3  # (B, T, 3, nh, hs), as attention's projection
    projected[0, 0, 0, 0] = 0.0
    ours, torchs = projected.clone().requires_grad_(), projected.clone().requires_grad_()
    grad = torch.randn(2, 2, 4, 8, 16)
    out = normalise_and_rotate(ours.permute(2, 0, 3, 1, 4)[:2], rotary, 5)
    reference = rotary(torch.nn.functional.rms_norm(torchs.permute(2, 0, 3, 1, 4)[:2], (16,)), 5)
    out.backward(grad)
    reference.backward(grad)
    assert_close(out, reference, rtol=1e-6, atol=1e-6)
    assert_close(ours.grad, torchs.grad, rtol=1e-5, atol=1e-5)
    double = RotaryEmbedding(head_dim=8, context_length=16).double()
    x = torch.randn(2, 3, 6, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: _NormaliseRotate.apply(v, *double.tables(v, 2)), x)


def test_in_bf16_on_a_cpu_the_node_computes_in_fp32_and_rounds_once() -> None:
    """bf16 on a CPU takes the node too: its output and gradient are the fp32 node's on the
    widened input, rounded to bf16 once, and within bf16's rounding of the two apart (F.rms_norm,
    then the rotation, each rounding to bf16). fp16, other devices and compiled models keep the
    two apart."""
    torch.manual_seed(0)
    rotary = RotaryEmbedding(head_dim=16, context_length=32)
    projected = (torch.randn(2, 8, 3, 4, 16) * 3).bfloat16()
    ours, wide, apart = (projected.clone().requires_grad_() for _ in range(3))
    wide_grad = torch.randn(2, 2, 4, 8, 16)
    out = normalise_and_rotate(ours.permute(2, 0, 3, 1, 4)[:2], rotary, 5)
    reference = normalise_and_rotate(wide.float().permute(2, 0, 3, 1, 4)[:2], rotary, 5)
    two = rotary(torch.nn.functional.rms_norm(apart.permute(2, 0, 3, 1, 4)[:2], (16,)), 5)
    assert out.dtype == torch.bfloat16 and torch.equal(out, reference.bfloat16())
    assert_close(out.float(), two.float(), rtol=0, atol=0.04)  # ~bf16's rounding at values up to ~2
    out.backward(wide_grad.bfloat16())
    reference.backward(wide_grad.bfloat16().float())
    two.backward(wide_grad.bfloat16())
    assert ours.grad.dtype == torch.bfloat16 and torch.equal(ours.grad, wide.grad)
    assert_close(ours.grad.float(), apart.grad.float(), rtol=0.02, atol=0.02)
    assert _one_node(projected) and not _one_node(projected.half())
    assert not _one_node(torch.empty(2, 16, dtype=torch.bfloat16, device="meta"))


def test_the_rotation_by_halves_is_the_full_width_rotation_bit_for_bit_and_contiguous() -> None:
    """The node rotates a half at a time: the numbers of the full-width form (a product, the
    swapped copy, one addcmul), forward and back, into a contiguous tensor whatever the input's
    layout (the attention's queries and keys then reshape without a copy)."""
    torch.manual_seed(0)
    rotary = RotaryEmbedding(head_dim=32, context_length=64)
    x = torch.randn(3, 64, 3, 4, 32).permute(2, 0, 3, 1, 4)[:2]  # the projection's view
    cos, sin = rotary.tables(x, 0)
    forward, back = _rotate(x, cos, sin), _rotate(x, cos, sin, back=True)
    assert torch.equal(forward, torch.addcmul(x * cos, swap_halves(x), sin))
    assert torch.equal(back, torch.addcmul(x * cos, swap_halves(x), sin, value=-1))
    assert forward.is_contiguous() and back.is_contiguous()
    assert_close(_rotate(forward, cos, sin, back=True), x)  # R^T R = I


def test_rope_has_no_position_table_and_one_rotation_table_for_every_layer() -> None:
    model = build(position_embedding="rope")
    assert "wpe" not in model.transformer
    rotaries = {id(block.attn.rotary) for block in model.transformer.h}
    assert len(rotaries) == 1 and not any("rotary" in key for key in model.state_dict())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_squared_relu_has_autograds_numbers_bit_for_bit(dtype: torch.dtype) -> None:
    """Its hand-written gradient is a speed-up, not a change: forward and backward equal what
    autograd makes of torch.relu(x).square(), zeros and negative inputs included."""
    x = torch.randn(3, 5, 64).to(dtype)
    x[0, 0, :4] = torch.tensor([0.0, -0.0, -1.0, 1.0])
    grad = torch.randn_like(x)
    ours, autograds = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = build(activation="relu2").transformer.h[0].mlp.gelu(ours)
    reference = torch.relu(autograds).square()
    out.backward(grad)
    reference.backward(grad)
    assert out.dtype == dtype and torch.equal(out, reference)
    assert torch.equal(ours.grad, autograds.grad)


def test_each_lever_computes_what_it_names() -> None:
    x = torch.randn(4, 16)
    relu2 = build(activation="relu2").transformer.h[0].mlp.gelu
    assert_close(relu2(x), torch.relu(x) ** 2)
    rms = build(norm="rmsnorm")
    assert all(not isinstance(m, nn.LayerNorm) for m in rms.modules())
    assert isinstance(rms.transformer.ln_f, nn.RMSNorm)
    torch.manual_seed(0)
    zero = GPT(GPTConfig(**BASE, zero_init_proj=True))
    for block in zero.transformer.h:
        assert not block.attn.out_proj.weight.any() and not block.mlp.c_proj.weight.any()
    ids = torch.randint(0, 50, (1, 6))
    with torch.no_grad():  # every block starts as the identity
        embedded = zero._embed(ids, 0)
        assert_close(zero(ids), zero.lm_head(zero.transformer.ln_f(embedded)))


def test_qk_norms_written_out_gradient_is_torchs_rms_norm() -> None:
    """QK-norm's fp32 path (forward and gradient by hand) against F.rms_norm, a zero vector
    included, and its gradient against finite differences in float64."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 8, 16) * 3
    x[0, 0, 0, 0] = 0.0
    grad = torch.randn_like(x)
    ours, torchs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, reference = rms_normalise(ours), torch.nn.functional.rms_norm(torchs, (16,))
    out.backward(grad)
    reference.backward(grad)
    assert_close(out, reference, rtol=1e-6, atol=1e-6)
    assert_close(ours.grad, torchs.grad, rtol=1e-5, atol=1e-6)
    double = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_RMSNormalise.apply, double)
    bf16 = x.bfloat16()  # bf16 takes torch's own
    assert torch.equal(rms_normalise(bf16), torch.nn.functional.rms_norm(bf16, (16,)))


def test_qk_norm_bounds_the_attention_scores() -> None:
    model = build(qk_norm=True)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.W_query.weight.mul_(100.0)  # huge queries: without the norm, one-hot rows
        weights = model.attention_weights(torch.randint(0, 50, (1, 12)))
    # Unit-RMS queries and keys: scores at most sqrt(head size) = 2.83, so no row is one-hot.
    assert all(float(w[..., 4:, :].max()) < 0.99 for w in weights)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(position_embedding="alibi"), "model position_embedding must be one of learned, rope"),
        (dict(norm="batchnorm"), "model norm must be one of layernorm, rmsnorm"),
        (dict(activation="swish"), "model activation must be one of gelu, relu2"),
        (dict(position_embedding="rope", n_embd=18, n_head=2), "rope needs an even head size, got 9"),
    ],
)
def test_bad_lever_settings_are_one_line(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GPTConfig(**{**BASE, **changes})
