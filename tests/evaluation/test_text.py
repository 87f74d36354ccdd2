"""Bits per byte and perplexity over windows with a stride, against each token scored by hand with
the context the windows give it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from minigpt.data import CharTokenizer, DataError
from minigpt.evaluation.text import read_documents, score_text
from minigpt.model import GPT, GPTConfig

TEXT = "Où est la clé? Ça coûte 3 €, “merci”. 😀 Adieu!\n"


@pytest.fixture(scope="module")
def char_model() -> tuple[GPT, CharTokenizer]:
    tokenizer = CharTokenizer.from_texts([TEXT])
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.n_vocab, context_length=8, n_layer=1, n_head=2, n_embd=16)
    return GPT(config).eval(), tokenizer


@pytest.mark.parametrize("stride", [1, 8])
def test_every_character_is_scored_once_with_the_context_its_window_gives(char_model, stride: int) -> None:
    model, tokenizer = char_model
    # The first character is predicted from a line break (the char vocabulary has no end-of-text).
    stream = tokenizer.encode("\n" + TEXT)
    total = 0.0
    for p in range(1, len(stream)):
        # Windows of 8 inputs start every `stride` tokens; token p is scored by the first window
        # that reaches it: the one starting at the smallest multiple of the stride >= p - 8.
        begin = 0 if p <= 8 else ((p - 8) + stride - 1) // stride * stride
        with torch.no_grad():
            logits = model(torch.tensor([stream[begin:p]]))[0, -1].double()
        total -= F.log_softmax(logits, dim=-1)[stream[p]].item()
    score = score_text(model, tokenizer, [TEXT], context_length=8, stride=stride, batch_size=4)
    assert (score.tokens, score.bytes) == (len(TEXT), len(TEXT.encode("utf-8")))
    assert score.loss == pytest.approx(total / len(TEXT), rel=1e-6)
    assert score.bits_per_byte == pytest.approx(total / math.log(2) / len(TEXT.encode("utf-8")), rel=1e-6)
    assert score.perplexity == pytest.approx(math.exp(total / len(TEXT)), rel=1e-6)


def test_the_tail_is_the_same_characters_for_every_tokenizer(tmp_path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "abcdefghij"}\n{"text": "0123456789"}\n')
    source = str(tmp_path / "a.jsonl")
    assert read_documents(source) == ["abcdefghij", "0123456789"]
    assert read_documents(source, tail=0.6) == ["ij", "0123456789"]  # the last 12 of 20 characters
    assert read_documents(source, tail=0.25) == ["56789"]


def test_bad_windows_are_one_line(char_model) -> None:
    model, tokenizer = char_model
    with pytest.raises(DataError, match="stride must be 1..context_length"):
        score_text(model, tokenizer, [TEXT], context_length=4, stride=5)
    with pytest.raises(DataError, match="context_length must be 1..8"):
        score_text(model, tokenizer, [TEXT], context_length=9)
