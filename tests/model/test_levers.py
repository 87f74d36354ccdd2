"""The optional architecture settings: rotary positions, QK-norm, RMSNorm, squared ReLU, zero-init
projections, logit soft-capping. Each keeps causality, cache parity and SDPA == explicit."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from minigpt.model import GPT, ConfigError, GPTConfig
from minigpt.model.attention import RotaryEmbedding
from minigpt.model.generation import generate
from minigpt.model.gpt import parameter_count

BASE = dict(vocab_size=50, context_length=16, n_layer=2, n_head=2, n_embd=16)
LEVERS = {
    "rope": dict(position_embedding="rope"),
    "qk_norm": dict(qk_norm=True),
    "rmsnorm": dict(norm="rmsnorm"),
    "relu2": dict(activation="relu2"),
    "zero_init": dict(zero_init_proj=True),
    "softcap": dict(logit_softcap=5.0),
    "value_residual": dict(value_residual=True),
    "unet_skips": dict(unet_skips=True, n_layer=3),  # an odd depth: the middle block has no mirror
    "embed_norm": dict(embed_norm=True),
    "all": dict(
        position_embedding="rope",
        qk_norm=True,
        norm="rmsnorm",
        activation="relu2",
        logit_softcap=5.0,
        value_residual=True,
        unet_skips=True,
        embed_norm=True,
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
        capped, raw = build(logit_softcap=2.0), build()
        assert capped(ids).abs().max() < 2.0
        assert_close(capped(ids), 2.0 * torch.tanh(raw(ids) / 2.0))


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
        (dict(logit_softcap=0.0), "model logit_softcap must be positive or null"),
        (dict(position_embedding="rope", n_embd=18, n_head=2), "rope needs an even head size, got 9"),
    ],
)
def test_bad_lever_settings_are_one_line(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GPTConfig(**{**BASE, **changes})


def test_value_residual_mixes_each_later_block_s_values_with_the_first_block_s() -> None:
    mixed, plain = build(value_residual=True), build()
    assert not hasattr(mixed.transformer.h[0].attn, "value_lambdas")  # the first block has none
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        for block in mixed.transformer.h[1:]:
            block.attn.value_lambdas.copy_(torch.tensor([1.0, 0.0]))  # its own values only
        assert_close(mixed(ids), plain(ids))
        for block in mixed.transformer.h[1:]:
            block.attn.value_lambdas.copy_(torch.tensor([0.0, 1.0]))  # the first block's only
        first_values = mixed.transformer.h[0].attn._project(
            mixed.transformer.h[0].ln_1(mixed._embed(ids, 0))
        )[1]
        x, values = mixed.transformer.h[0](mixed._embed(ids, 0), return_values=True)
        assert_close(values, first_values)
        second = mixed.transformer.h[1]
        expected = x + second.attn(second.ln_1(x), first_values=first_values)
        expected = expected + second.mlp(second.ln_2(expected))
        assert_close(mixed.transformer.ln_f(expected), mixed.features(ids))


def test_unet_skips_add_each_first_half_output_to_its_mirror_s_input() -> None:
    skipped, plain = build(unet_skips=True, n_layer=4), build(n_layer=4)
    assert skipped.skip_weights.tolist() == [1.0, 1.0]
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        h = skipped.transformer.h
        out0 = h[0](skipped._embed(ids, 0))
        out1 = h[1](out0)
        out2 = h[2](out1 + out1)  # block 2 mirrors block 1
        out3 = h[3](out2 + out0)  # block 3 mirrors block 0
        assert_close(skipped.features(ids), skipped.transformer.ln_f(out3))
        skipped.skip_weights.zero_()
        assert_close(skipped(ids), plain(ids))


def test_embed_norm_gives_unit_rms_embeddings() -> None:
    model = build(embed_norm=True)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(30.0)
        x = model._embed(torch.randint(0, 50, (2, 9)), 0)
    assert_close(x.square().mean(-1), torch.ones(2, 9), rtol=1e-4, atol=1e-4)
