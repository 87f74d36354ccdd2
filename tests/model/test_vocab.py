"""New token ids in a trained GPT: rows at the mean of the trained ones, old ids' logits unchanged."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from minigpt.model import GPT, GPTConfig
from minigpt.model.vocab import add_token_rows

CONFIG = GPTConfig(vocab_size=50, context_length=16, n_layer=2, n_head=2, n_embd=32)


@pytest.mark.parametrize("tie_weights", [True, False])
def test_new_rows_are_the_mean_and_old_ids_predict_as_before(tie_weights: bool) -> None:
    torch.manual_seed(0)
    model = GPT(replace(CONFIG, tie_weights=tie_weights)).eval()
    idx = torch.randint(0, 50, (2, 10))
    before = model(idx)
    old_wte, old_head = model.transformer.wte.weight.clone(), model.lm_head.weight.clone()
    add_token_rows(model, 54)
    assert model.config.vocab_size == 54 and model.transformer.wte.num_embeddings == 54
    wte, head = model.transformer.wte.weight, model.lm_head.weight
    assert wte.shape == head.shape == (54, 32)
    assert (head is wte) == tie_weights
    torch.testing.assert_close(wte[:50], old_wte)
    torch.testing.assert_close(wte[50:], old_wte.mean(0).expand(4, -1))
    torch.testing.assert_close(head[50:], old_head.mean(0).expand(4, -1))
    after = model(idx)
    torch.testing.assert_close(after[..., :50], before)  # the old ids' logits are untouched
    # A new id's logit is the mean of the old ones': where the model starts for a new marker.
    torch.testing.assert_close(after[..., 50], before.mean(-1))
    model(torch.tensor([[53, 1, 52]])).sum().backward()  # the new ids read and train
    assert wte.grad is not None and wte.grad[53].abs().sum() > 0


def test_a_padded_table_keeps_its_size_and_resets_the_rows_past_the_trained_ids() -> None:
    torch.manual_seed(0)
    model = GPT(CONFIG)
    trained = model.transformer.wte.weight[:45].clone()
    add_token_rows(model, 48, trained=45)  # a 45-id tokenizer padded to 50 rows gains 3 markers
    wte = model.transformer.wte.weight
    assert wte.shape == (50, 32) and model.config.vocab_size == 50
    torch.testing.assert_close(wte[45:48], trained.mean(0).expand(3, -1))
    with pytest.raises(ValueError, match="trained ids 60 must be in 1..50"):
        add_token_rows(model, 54, trained=60)
