"""Our tokenizers in transformers: `AutoTokenizer` on the files export writes encodes and decodes
as ours do, on text with non-ASCII characters, line breaks and the end-of-text token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minigpt.checkpoints.hf_export import write_tokenizer
from minigpt.data import (
    CharTokenizer,
    CompactGPT2Tokenizer,
    DataError,
    GPT2Tokenizer,
    spec_from_hf_tokenizer_json,
)

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TEXT = "KING:\r\nÉté, naïve — 日本語 😀\n\n\tend.\n"
"""Accents, a dash, CJK, an emoji outside the BMP, CRLF, blank lines, a tab."""


def auto_tokenizer(tokenizer, folder: Path):
    write_tokenizer(tokenizer, folder, context_length=64)
    return transformers.AutoTokenizer.from_pretrained(folder)


def test_a_char_vocabulary_encodes_decodes_and_refuses_as_ours(tmp_path: Path) -> None:
    ours = CharTokenizer("".join(sorted(set(TEXT + "abc"))))
    theirs = auto_tokenizer(ours, tmp_path)
    ids = theirs(TEXT)["input_ids"]
    assert ids == ours.encode(TEXT) and theirs.decode(ids) == TEXT
    every_id = list(range(ours.n_vocab))
    assert theirs.decode(every_id) == ours.decode(every_id)
    with pytest.raises(DataError):
        ours.encode("KINGZ")
    with pytest.raises(Exception, match="Missing"):  # no unknown token: refused, not replaced
        theirs("KINGZ")
    hf_json = json.loads((tmp_path / "tokenizer.json").read_text())
    assert spec_from_hf_tokenizer_json(hf_json, ours.n_vocab) == ours.spec()


@pytest.fixture(scope="module")
def compact(gpt2_encoding, tmp_path_factory: pytest.TempPathFactory):
    """A gpt2-compact vocabulary of a corpus with TEXT, and transformers' tokenizer of it."""
    ours = CompactGPT2Tokenizer.from_texts(
        [TEXT * 3, "one<|endoftext|>the end of the play"], GPT2Tokenizer(gpt2_encoding)
    )
    folder = tmp_path_factory.mktemp("compact")
    return ours, auto_tokenizer(ours, folder), json.loads((folder / "tokenizer.json").read_text())


def test_gpt2_compact_encodes_its_vocabulary_and_end_of_text_as_ours(compact) -> None:
    compact, theirs, hf_json = compact
    # "<|endoftext|>" in text is text to both; the end-of-text id decodes to it.
    text = TEXT + "one<|endoftext|>the end" + TEXT
    ids = theirs(text)["input_ids"]
    assert ids == compact.encode(text) and theirs.decode(ids) == text
    assert theirs.eos_token_id == compact.eot_id
    every_id = list(range(compact.n_vocab))
    assert theirs.decode(every_id) == compact.decode(every_id)
    # And back: the file gives our tokenizer's spec, for a model of the vocabulary's size.
    assert spec_from_hf_tokenizer_json(hf_json, compact.n_vocab) == compact.spec()


def test_gpt2_compact_gives_a_token_outside_its_vocabulary_an_id_the_model_lacks(compact) -> None:
    """Ours spells a GPT-2 token the corpus never had in bytes; a `tokenizers` BPE cannot, and
    gives GPT-2's token an id from n_vocab on: never a different split into ids the model has."""
    compact, theirs, _ = compact
    text = "the end Transformers"
    ours, hf = compact.encode(text), theirs(text)["input_ids"]
    assert len(ours) > len(hf)
    outside = [i for i in hf if i >= compact.n_vocab]
    assert outside and [i for i in hf if i < compact.n_vocab] == ours[: len(hf) - len(outside)]
