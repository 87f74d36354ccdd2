"""The architecture settings the recipes choose between: rotary positions, QK-norm, RMSNorm,
squared ReLU, zero-init projections. Each keeps causality, cache parity and SDPA == explicit."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from minigpt.model import GPT, ConfigError, GPTConfig
from minigpt.model.config import parameter_count
from minigpt.model.generation import generate
from minigpt.model.rotary import RotaryEmbedding

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


def test_rope_has_no_position_table_and_one_rotation_table_for_every_layer() -> None:
    model = build(position_embedding="rope")
    assert "wpe" not in model.transformer
    rotaries = {id(block.attn.rotary) for block in model.transformer.h}
    assert len(rotaries) == 1 and not any("rotary" in key for key in model.state_dict())


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
