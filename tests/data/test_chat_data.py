"""Conversations as padded windows whose loss counts the assistant's tokens only, one per window or
packed; conversations longer than the context truncated and counted, or refused naming their row."""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minigpt.data import DataError
from minigpt.data.chat.conversations import (
    IGNORE_INDEX,
    ChatDataConfig,
    ConversationWindows,
    PackedConversationWindows,
    encode_conversations,
    first_fit,
    load_chat_examples,
)
from minigpt.data.chat.instructions import Conversation
from minigpt.data.chat.template import ChatEncoder
from minigpt.data.tokenizer import CharTokenizer, with_chat_tokens
from minigpt.training.loss import next_token_loss

T = 48


@pytest.fixture(scope="module")
def encoder() -> ChatEncoder:
    return ChatEncoder(with_chat_tokens(CharTokenizer.from_texts([string.printable])))


def _conversation(question: str, answer: str, where: str = "chats.jsonl, row 1") -> Conversation:
    return Conversation(
        where, [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    )


def test_a_window_is_one_conversation_padded_with_only_the_answer_as_targets(encoder: ChatEncoder) -> None:
    examples = encode_conversations([_conversation("Hi?", "Hello."), _conversation("2+3?", "5")], encoder, T)
    windows = ConversationWindows(examples, T, pad_id=encoder.tokenizer.end_id)
    assert len(windows) == 2
    x, y = windows[0]
    assert x.shape == y.shape == (T,) and x.dtype == y.dtype == torch.int64
    ids, _ = examples.conversation(0)
    n = len(ids) - 1
    assert x[:n].tolist() == ids[:-1].tolist() and (x[n:] == encoder.tokenizer.end_id).all()
    assert encoder.tokenizer.decode(y[y != IGNORE_INDEX].tolist()) == "Hello.<|end|>"
    # Every target the loss counts is the next input: the answer is predicted from what precedes it.
    kept = (y != IGNORE_INDEX).nonzero().squeeze(1)
    assert (y[kept[:-1]] == x[kept[:-1] + 1]).all()


def test_the_loss_is_the_mean_over_the_answers_tokens(encoder: ChatEncoder) -> None:
    examples = encode_conversations([_conversation("Hi?", "Hello."), _conversation("2+3?", "5")], encoder, T)
    x, y = map(torch.stack, zip(*ConversationWindows(examples, T, pad_id=0), strict=True))
    logits = torch.randn(2, T, encoder.tokenizer.n_vocab, generator=torch.Generator().manual_seed(0))
    kept = y != IGNORE_INDEX
    by_hand = F.cross_entropy(logits[kept], y[kept])  # only the answers' positions, nothing else
    torch.testing.assert_close(next_token_loss(logits, y), by_hand)
    assert kept.sum() == (len("Hello.") + 1) + (len("5") + 1)  # each answer and its end marker


def test_too_long_conversations_are_truncated_and_counted(encoder: ChatEncoder) -> None:
    fits = _conversation("Hi?", "Hello.")
    cut = _conversation("Tell me.", "x" * 100)  # its answer starts inside the window
    lost = _conversation("q" * 100, "Too late.")  # its answer starts after the window
    examples = encode_conversations([fits, cut, lost], encoder, T, too_long="truncate")
    assert (len(examples), examples.truncated, examples.dropped) == (2, 2, 1)
    ids, learned = examples.conversation(1)
    assert len(ids) == T + 1 and learned[-1]
    x, y = ConversationWindows(examples, T, pad_id=0)[1]
    assert y[0] == IGNORE_INDEX and y[-1] != IGNORE_INDEX and x[-1] == ids[-2]  # the question stays out


def test_too_long_conversations_can_be_refused_naming_the_row(encoder: ChatEncoder) -> None:
    long = _conversation("Tell me.", "x" * 100, where="chats.jsonl, row 7")
    with pytest.raises(DataError, match=r"chats.jsonl, row 7 is \d+ tokens, more than a window of 48"):
        encode_conversations([_conversation("Hi?", "Hello."), long], encoder, T, too_long="refuse")
    with pytest.raises(DataError, match="too_long must be one of truncate, refuse, got 'cut'"):
        ChatDataConfig("chats.jsonl", too_long="cut")
    with pytest.raises(DataError, match="no conversation is left"):
        encode_conversations([_conversation("q" * 100, "late")], encoder, T)


def test_a_file_of_instructions_becomes_windows(encoder: ChatEncoder, tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    rows = [{"instruction": "Hi?", "output": "Hello."}, {"instruction": "Say \u2603", "output": "\u2603"}]
    path.write_text(json.dumps(rows[0]) + "\n", encoding="utf-8")
    _, y = ConversationWindows(load_chat_examples(ChatDataConfig(str(path)), encoder, T), T, 0)[0]
    assert encoder.tokenizer.decode(y[y != IGNORE_INDEX].tolist()) == "Hello.<|end|>"
    # Text the tokenizer cannot encode (a character the char vocabulary lacks) names its row.
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    with pytest.raises(DataError, match=f"{path}, row 2: .*\u2603"):
        load_chat_examples(ChatDataConfig(str(path)), encoder, T)


def test_first_fit_puts_each_item_in_the_first_window_with_room() -> None:
    lengths = np.array([5, 3, 4, 2, 6, 1, 8])
    assert first_fit(lengths, 8, np.arange(7)) == [[0, 1], [2, 3, 5], [4], [6]]
    assert first_fit(lengths, 8, np.array([6, 5, 4, 3, 2, 1, 0])) == [[6], [5, 4], [3, 2], [1, 0]]


def test_packed_windows_hold_every_conversation_once_as_its_own_window_would(encoder: ChatEncoder) -> None:
    rng = np.random.default_rng(0)
    chats = [_conversation("q" * int(rng.integers(1, 12)), "a" * int(rng.integers(1, 12))) for _ in range(20)]
    examples = encode_conversations(chats, encoder, T)
    alone = ConversationWindows(examples, T, pad_id=0)
    packed = PackedConversationWindows(examples, T, pad_id=0, seed=3)
    assert len(packed) < len(examples) / 2  # each of ~10 to ~30 ids: several to a window of 48
    seen = []
    for index, conversations in enumerate(packed.windows):
        x, y, segments, positions = packed[index]
        assert all(t.shape == (T,) and t.dtype == torch.int64 for t in (x, y, segments, positions))
        assert segments.tolist() == sorted(segments.tolist())
        for segment, conversation in enumerate(conversations):
            mine = segments == segment
            n = int(mine.sum())
            x_alone, y_alone = alone[conversation]
            assert torch.equal(x[mine], x_alone[:n]) and torch.equal(y[mine], y_alone[:n])
            assert (y_alone[n:] == IGNORE_INDEX).all() and positions[mine].tolist() == list(range(n))
        padding = segments == len(conversations)
        assert (y[padding] == IGNORE_INDEX).all() and positions[padding].tolist() == list(
            range(int(padding.sum()))
        )
        seen += conversations
    assert sorted(seen) == list(range(len(examples)))
    # The seed alone decides the windows: the same again, others with another seed.
    assert PackedConversationWindows(examples, T, 0, seed=3).windows == packed.windows
    assert PackedConversationWindows(examples, T, 0, seed=4).windows != packed.windows
