import copy

import pytest
import torch

from minigpt.model import (
    GPT,
    GPTConfig,
    LastTokenHead,
    generate,
    generate_steps,
    generate_tokens,
    optimize_for_decoding,
)
from minigpt.model import generation as generation_module


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, context_length=12, n_layer=2, n_head=2, n_embd=32)).eval()


@pytest.mark.parametrize(
    "sampling", [dict(temperature=0.0), dict(temperature=1.0, top_k=10), dict(top_p=0.9)]
)
def test_cached_and_uncached_generation_give_identical_tokens(model: GPT, sampling: dict) -> None:
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    # 30 new tokens run well past the context of 12, through the sliding-window path.
    cached = generate(
        model, prompt, 30, use_cache=True, generator=torch.Generator().manual_seed(2), **sampling
    )
    uncached = generate(
        model, prompt, 30, use_cache=False, generator=torch.Generator().manual_seed(2), **sampling
    )
    assert cached.shape == (2, 35)
    assert torch.equal(cached, uncached)


def test_greedy_generation_follows_the_argmax(model: GPT) -> None:
    prompt = torch.tensor([[3, 1, 4]])
    out = generate(model, prompt, 4, temperature=0.0)
    for step in range(4):
        context = out[:, : 3 + step]
        assert out[0, 3 + step] == model(context)[0, -1].argmax()


def test_stops_at_the_stop_token(model: GPT) -> None:
    prompt = torch.tensor([[3, 1, 4]])
    first = generate(model, prompt, 1, temperature=0.0)[0, -1].item()
    steps = list(generate_tokens(model, prompt, 10, temperature=0.0, stop_token=first))
    assert len(steps) == 1


def test_a_batch_stops_once_every_row_has_stopped(model: GPT, monkeypatch: pytest.MonkeyPatch) -> None:
    stop = 9
    # Row 0 stops at the second step, row 1 at the fourth; then a step no row should get to.
    script = iter([[5, 6], [stop, 7], [8, 8], [5, stop], [1, 1], [2, 2]])
    monkeypatch.setattr(
        generation_module, "sample_next", lambda logits, **kwargs: torch.tensor(next(script)).unsqueeze(1)
    )
    prompt = torch.tensor([[3, 1, 4], [1, 5, 9]])
    steps = [step.squeeze(1).tolist() for step in generate_tokens(model, prompt, 6, stop_token=stop)]
    assert steps == [[5, 6], [stop, 7], [8, 8], [5, stop]]


def test_long_prompt_is_cropped_from_the_left(model: GPT) -> None:
    prompt = torch.randint(0, 64, (1, 40))
    out = generate(model, prompt, 3, temperature=0.0)
    assert torch.equal(out[:, -3:], generate(model, prompt[:, -12:], 3, temperature=0.0)[:, -3:])


def test_zero_new_tokens_returns_the_prompt(model: GPT) -> None:
    prompt = torch.tensor([[1, 2]])
    assert torch.equal(generate(model, prompt, 0), prompt)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, prompt, -1)


@pytest.mark.parametrize("slabs", [1, 2, 3, 7, 40])
def test_last_token_head_matches_the_model_head(model: GPT, slabs: int) -> None:
    # vocab 64 is not a multiple of 3, 7 or 40 (40 leaves slabs with no rows at all): the padding
    # must be cut off again.
    hidden = torch.randn(3, 32, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = model.lm_head(hidden)
        actual = LastTokenHead(model, slabs=slabs)(hidden)
    assert actual.shape == (3, 64)
    torch.testing.assert_close(actual, expected)


def test_decoding_layout_keeps_values_and_tokens() -> None:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=64, context_length=12, n_layer=2, n_head=2, n_embd=32)
    model = GPT(config).eval()
    reference = copy.deepcopy(model)
    optimize_for_decoding(model)
    weight = model.transformer.h[0].mlp.c_fc.weight
    assert weight.shape == (128, 32) and weight.stride() == (1, 128)  # input-major
    for (name, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs), name
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    assert torch.equal(
        generate(model, prompt, 20, temperature=0.0), generate(reference, prompt, 20, temperature=0.0)
    )


def test_prepared_head_is_reused_until_the_weights_change() -> None:
    torch.manual_seed(0)
    model = optimize_for_decoding(
        GPT(GPTConfig(vocab_size=64, context_length=12, n_layer=1, n_head=2, n_embd=32))
    )
    prepared = LastTokenHead.of(model)
    assert prepared is model._last_token_head
    hidden = torch.randn(2, 32)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # what an optimizer step does to the tied weights
    fresh = LastTokenHead.of(model)
    assert fresh is not prepared
    with torch.inference_mode():
        torch.testing.assert_close(fresh(hidden), model.lm_head(hidden))


def test_each_step_yields_the_logits_its_token_was_drawn_from(model: GPT) -> None:
    # What a server reports as log-probabilities: the full model's last-position logits for the
    # sequence so far, before temperature, also once the window slides past the context of 12.
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    steps = list(
        generate_steps(model, prompt, 10, temperature=0.7, generator=torch.Generator().manual_seed(3))
    )
    tokens = torch.cat([prompt, *(token for token, _ in steps)], dim=1)
    for step, (_, logits) in enumerate(steps):
        expected = model(tokens[:, : 5 + step][:, -12:])[:, -1]
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(
        tokens, generate(model, prompt, 10, temperature=0.7, generator=torch.Generator().manual_seed(3))
    )
