import math

import pytest
import torch
from torch.testing import assert_close

from minigpt.model import GPT, Block, ConfigError, GPTConfig


def tiny(**overrides) -> GPTConfig:
    fields = dict(vocab_size=50, context_length=16, n_layer=2, n_head=2, n_embd=32)
    return GPTConfig(**(fields | overrides))


def test_forward_maps_ids_to_logits() -> None:
    model = GPT(tiny())
    logits = model(torch.randint(0, 50, (3, 11)))
    assert logits.shape == (3, 11, 50)
    assert logits.dtype == torch.float32


def test_changing_a_future_token_never_changes_earlier_logits() -> None:
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    ids = torch.randint(0, 50, (2, 16))
    changed = ids.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 50
    before, after = model(ids), model(changed)
    assert_close(before[:, :9], after[:, :9])
    assert not torch.allclose(before[:, 9:], after[:, 9:])


def test_blocks_normalise_each_branch_input_and_never_the_residual_stream() -> None:
    """Pre-LayerNorm (GPT-2): x + attn(ln_1(x)), then + mlp(ln_2(.)); ln_f once, before the head."""
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    for norm in model.modules():
        if isinstance(norm, torch.nn.LayerNorm):  # away from (1, 0), so every placement shows
            torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
            torch.nn.init.normal_(norm.bias)
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        x = model.transformer.wte(ids) + model.transformer.wpe(torch.arange(9))
        for block in model.transformer.h:
            assert block.ln_1.weight.shape == (32,)
            x = x + block.attn(block.ln_1(x))
            x = x + block.mlp(block.ln_2(x))
        expected = model.lm_head(model.transformer.ln_f(x))
        assert_close(model(ids), expected)


def test_weights_are_tied_by_default_and_can_be_untied() -> None:
    tied, untied = GPT(tiny()), GPT(tiny(tie_weights=False))
    assert tied.lm_head.weight is tied.transformer.wte.weight
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert untied.num_parameters() - tied.num_parameters() == 50 * 32


def test_gpt2_small_shape_has_gpt2_parameter_count() -> None:
    # 124,439,808 is GPT-2 small's published parameter count (tied head, biases everywhere).
    config = GPTConfig(
        vocab_size=50257, context_length=1024, n_layer=12, n_head=12, n_embd=768, qkv_bias=True
    )
    with torch.device("meta"):
        model = GPT(config)
    assert model.num_parameters(non_embedding=False) == 124_439_808


def test_residual_projections_use_scaled_init() -> None:
    torch.manual_seed(0)
    model = GPT(tiny(n_layer=8, n_embd=256, n_head=4))
    scaled = 0.02 / 4  # GPT-2: 0.02 / sqrt(2 * n_layer), for the two projections into the residual stream
    for block in (model.transformer.h[0], model.transformer.h[7]):
        assert math.isclose(block.mlp.c_proj.weight.std().item(), scaled, rel_tol=0.05)
        assert math.isclose(block.attn.out_proj.weight.std().item(), scaled, rel_tol=0.05)
        for layer in (block.mlp.c_fc, block.attn.W_query, block.attn.W_key, block.attn.W_value):
            assert math.isclose(layer.weight.std().item(), 0.02, rel_tol=0.05)


def test_state_dict_has_gpt2_style_names_and_no_mask() -> None:
    keys = set(GPT(tiny()).state_dict())
    assert {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight"} <= keys
    assert {"transformer.h.0.attn.W_query.weight", "transformer.h.1.mlp.c_proj.weight"} <= keys
    assert not any(k.endswith("mask") for k in keys)


def test_overfits_one_batch() -> None:
    torch.manual_seed(0)
    model = GPT(tiny())
    ids = torch.randint(0, 50, (4, 17))
    x, y = ids[:, :-1], ids[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1


def test_too_long_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="exceeds context length 16"):
        GPT(tiny())(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(n_embd=30, n_head=4), "n_embd \\(30\\) must be divisible by n_head \\(4\\)"),
        (dict(n_layer=0), "n_layer must be at least 1"),
        (dict(dropout=1.0), "dropout"),
        (dict(attention="flash"), "model attention must be one of auto, sdpa, explicit"),
        (dict(gelu_approximate="erf"), "model gelu_approximate must be one of none, tanh, got 'erf'"),
    ],
)
def test_bad_config_names_the_problem(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny(**overrides)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_mlp_uses_the_configured_gelu(approximate: str) -> None:
    mlp = GPT(tiny(gelu_approximate=approximate)).transformer.h[0].mlp
    x = torch.linspace(-4, 4, 33).repeat(64, 1).t()  # (33, 64): one row per input value
    expected = torch.nn.functional.gelu(x, approximate=approximate)
    torch.testing.assert_close(mlp.gelu(x), expected, rtol=0, atol=0)
    other = "tanh" if approximate == "none" else "none"
    assert not torch.equal(mlp.gelu(x), torch.nn.functional.gelu(x, approximate=other))


def manual_weights(block: Block, x: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(hs) + mask) of one block on its input x (B, T, C), written out: (B, nh, T, T)."""
    attn = block.attn
    h = block.ln_1(x)
    b, t, _ = h.shape

    def heads(y: torch.Tensor) -> torch.Tensor:
        return y.view(b, t, attn.num_heads, attn.head_dim).transpose(1, 2)

    q, k = heads(h @ attn.W_query.weight.T), heads(h @ attn.W_key.weight.T)
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(attn.head_dim) + torch.where(future, -math.inf, 0.0)
    return torch.softmax(scores, dim=-1)


def test_attention_weights_are_causal_rows_of_one_per_layer_and_head() -> None:
    torch.manual_seed(0)
    model = GPT(tiny(n_layer=3))
    weights = model.attention_weights(torch.randint(0, 50, (2, 9)))
    assert len(weights) == 3
    for w in weights:
        assert w.shape == (2, 2, 9, 9)
        assert_close(w.sum(-1), torch.ones(2, 2, 9))
        assert torch.all(w.triu(diagonal=1) == 0)
        assert torch.all(w[..., torch.ones(9, 9, dtype=torch.bool).tril()] > 0)  # the past is seen


@pytest.mark.parametrize("attention", ["sdpa", "explicit", "auto"])
def test_attention_weights_equal_a_manual_computation(attention: str) -> None:
    torch.manual_seed(0)
    model = GPT(tiny(attention=attention)).eval()
    ids = torch.randint(0, 50, (2, 11))
    weights = model.attention_weights(ids)
    with torch.no_grad():
        x = model.transformer.wte(ids) + model.transformer.wpe(torch.arange(11))
        assert_close(weights[0], manual_weights(model.transformer.h[0], x))
        # The second layer sees the first block's output: the blocks are chained as in forward.
        assert_close(weights[1], manual_weights(model.transformer.h[1], model.transformer.h[0](x)))


def test_attention_weights_run_without_dropout_or_gradients_and_keep_the_mode() -> None:
    torch.manual_seed(0)
    model = GPT(tiny(dropout=0.5)).train()
    ids = torch.randint(0, 50, (1, 8))
    first, second = model.attention_weights(ids), model.attention_weights(ids)
    assert model.training
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)  # dropout would draw new weights each call
        assert not a.requires_grad
        assert_close(a.sum(-1), torch.ones(1, 2, 8))
    model.eval()
    model.attention_weights(ids)
    assert not model.training


def test_block_with_weights_gives_the_same_output_as_forward() -> None:
    torch.manual_seed(0)
    block = GPT(tiny()).transformer.h[0]
    x = torch.randn(2, 7, 32)
    out, weights = block.forward_with_weights(x)
    assert_close(out, block(x))
    assert weights.shape == (2, 2, 7, 7)


def test_attention_weights_reject_too_long_input() -> None:
    with pytest.raises(ValueError, match="exceeds context length 16"):
        GPT(tiny()).attention_weights(torch.zeros(1, 17, dtype=torch.long))
