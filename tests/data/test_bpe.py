"""The learned byte-level BPE: exact round trips, determinism, a vocabulary learned from the training
split only, and bad options as one line."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest
import tokenizers

from minigpt.data import BPETokenizer, DataConfig, DataError, prepare, tokenizer_from_spec
from minigpt.data.corpus import resolve_corpus
from minigpt.data.prepare import _cache_key
from minigpt.data.split import training_text

from .helpers import CORPUS, TRICKY


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.learn([CORPUS], vocab_size=340)


def test_round_trip_is_exact_for_any_text(bpe: BPETokenizer) -> None:
    ids = bpe.encode(TRICKY)
    assert bpe.decode(ids) == TRICKY
    assert all(0 <= i < bpe.n_vocab for i in ids)
    assert (bpe.n_vocab, bpe.eot_id, bpe.special_tokens) == (340, 0, {0: "<|endoftext|>"})
    # The spelling of the end-of-text token in text is text; only the pipeline inserts the token.
    assert bpe.eot_id not in ids
    assert bpe.decode([bpe.eot_id, *bpe.encode("x")]) == "<|endoftext|>x"
    # Learned merges are used: the corpus's words are single tokens.
    assert len(bpe.encode(" winter of our discontent")) == 4


def test_long_texts_are_encoded_in_pieces_with_the_tokens_of_the_whole(bpe: BPETokenizer) -> None:
    text = CORPUS * 10 + TRICKY
    assert len(text) > 1 << 17  # cut into pieces for parallel encoding
    (ids,) = bpe.encode_to_arrays([text])
    assert ids.tolist() == bpe._tokenizer.encode(text, add_special_tokens=False).ids
    assert [a.tolist() for a in bpe.encode_to_arrays(["", "x"])] == [[], bpe.encode("x")]


def test_learning_is_deterministic_and_the_spec_rebuilds_it(bpe: BPETokenizer) -> None:
    again = BPETokenizer.learn(iter([CORPUS[:5000], CORPUS[5000:]]), vocab_size=340)
    assert again.hf_tokenizer_json() == bpe.hf_tokenizer_json()
    rebuilt = tokenizer_from_spec(json.loads(json.dumps(bpe.spec())))
    assert rebuilt.spec() == bpe.spec()
    assert rebuilt.encode(TRICKY) == bpe.encode(TRICKY)
    # The export is a tokenizer.json the Hugging Face library reads back to the same tokens.
    theirs = tokenizers.Tokenizer.from_str(bpe.hf_tokenizer_json())
    assert theirs.encode(TRICKY.replace("<|endoftext|>", "")).ids == bpe.encode(
        TRICKY.replace("<|endoftext|>", "")
    )


def test_special_tokens_and_vocab_size_are_options() -> None:
    bpe = BPETokenizer.learn([CORPUS], vocab_size=300, special_tokens=["<|eot|>", "<|pad|>"])
    assert (bpe.n_vocab, bpe.eot_id, bpe.special_tokens) == (300, 0, {0: "<|eot|>", 1: "<|pad|>"})
    assert bpe.decode(bpe.encode(TRICKY)) == TRICKY


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"vocab_size": 256},
            "data.vocab_size 256 is too small for bpe: it needs the 256 bytes and 1 special",
        ),
        ({"vocab_size": 259, "special_tokens": ("a", "b", "c", "d")}, "at least 260"),
        ({"special_tokens": ("<s>", "<s>")}, "data.special_tokens must be distinct non-empty strings"),
        ({"special_tokens": ("",)}, "data.special_tokens must be distinct non-empty strings"),
    ],
)
def test_bad_options_are_one_line(options: dict, message: str) -> None:
    with pytest.raises(DataError, match=message) as caught:
        DataConfig(tokenizer="bpe", **options)
    assert "\n" not in str(caught.value)


def test_a_vocabulary_the_training_text_cannot_fill_is_one_line() -> None:
    with pytest.raises(DataError, match="vocab_size 5000 is more than the training text supports") as caught:
        BPETokenizer.learn([CORPUS], vocab_size=5000)
    assert "\n" not in str(caught.value)


def test_a_text_too_small_for_the_default_size_gets_the_vocabulary_it_supports(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        tokenizer = BPETokenizer.learn([CORPUS])
    assert 257 < tokenizer.n_vocab < 4096
    (line,) = [r.getMessage() for r in caplog.records if "data.vocab_size" in r.getMessage()]
    assert f"using {tokenizer.n_vocab} (set data.vocab_size to choose)" in line
    assert BPETokenizer.learn([CORPUS]).spec() == tokenizer.spec()  # the same every time


def test_the_vocabulary_never_sees_the_validation_split(tmp_path: Path) -> None:
    """Random letters (a token each), then text the merges compress, then validation text whose
    pairs ("ss", "pp") would be merged if they were seen. A tenth of the tokens reaches back past
    the last tenth of the bytes into the learned text, so the split must start after it instead."""
    rng = random.Random(0)
    noise = "".join(
        "".join(rng.choices("ABCDEFGHIJKLMNOQRTUVWXYZ0123456789", k=59)) + "\n" for _ in range(1000)
    )
    unseen = "Mississippi hums.\n" * 400
    (tmp_path / "corpus.txt").write_text(noise + CORPUS * 8 + unseen, encoding="utf-8")
    config = DataConfig(source=str(tmp_path / "corpus.txt"), tokenizer="bpe", vocab_size=320)
    prepared = prepare(config, cache_root=tmp_path / "cache")
    bpe = prepared.tokenizer()
    assert not any(b"ss" in token or b"pp" in token for token in bpe.token_bytes())
    learned = "".join(training_text(resolve_corpus(config.source), config.val_fraction))
    assert len(learned.encode()) == bpe.learned_bytes
    train_text = bpe.decode(prepared.tokens("train").tolist())
    assert train_text.startswith(learned)
    assert train_text + bpe.decode(prepared.tokens("val").tolist()) == noise + CORPUS * 8 + unseen
    # Validation got fewer than a tenth of the tokens rather than any learned text.
    assert 0 < prepared.num_tokens("val") < 0.1 * (prepared.num_tokens("train") + prepared.num_tokens("val"))


def test_the_options_are_part_of_the_cache_key(tmp_path: Path) -> None:
    (tmp_path / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    corpus = resolve_corpus(str(tmp_path / "corpus.txt"))

    def key(**options: object) -> str:
        return _cache_key(corpus, DataConfig(source=str(tmp_path / "corpus.txt"), tokenizer="bpe", **options))

    assert key() == key(vocab_size=4096, special_tokens=("<|endoftext|>",))
    assert len({key(), key(vocab_size=8192), key(special_tokens=("<|eot|>",))}) == 3


def test_byte_lengths_spell_the_text_bytes_and_special_tokens_none(bpe: BPETokenizer) -> None:
    """What val_bpb divides by: the tokens of any text, emoji split into partial characters
    included, add up to its UTF-8 bytes; end-of-text stands for no text."""
    lengths = bpe.byte_lengths()
    assert lengths.shape == (bpe.n_vocab,) and lengths[bpe.eot_id] == 0
    for text in (TRICKY, "🙂", "ö" * 7, CORPUS[:300]):
        assert int(lengths[bpe.encode(text)].sum()) == len(text.encode("utf-8")), text


def test_a_folder_that_lost_its_spec_reads_the_bpe_back_from_tokenizer_json(bpe: BPETokenizer) -> None:
    """A Hugging Face folder re-saved by transformers keeps only tokenizer.json."""
    from minigpt.data import spec_from_hf_tokenizer_json

    spec = spec_from_hf_tokenizer_json(json.loads(bpe.hf_tokenizer_json()), bpe.n_vocab)
    assert spec is not None and spec["name"] == "bpe"
    assert tokenizer_from_spec(spec).encode(TRICKY) == bpe.encode(TRICKY)
    assert spec_from_hf_tokenizer_json(json.loads(bpe.hf_tokenizer_json()), bpe.n_vocab + 1) is None
