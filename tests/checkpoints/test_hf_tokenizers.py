"""Our tokenizers in transformers: `AutoTokenizer` on the files export writes encodes and decodes
as ours do, on text with non-ASCII characters, line breaks and the end-of-text token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minigpt.checkpoints import load_model, save_huggingface
from minigpt.checkpoints.hf_export import write_tokenizer
from minigpt.checkpoints.huggingface import tokenizer_spec_of
from minigpt.data import (
    CharTokenizer,
    CompactGPT2Tokenizer,
    DataError,
    GPT2Tokenizer,
    spec_from_hf_tokenizer_json,
)
from minigpt.model import GPT, GPTConfig

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


CORPUS = [TEXT * 3, "one<|endoftext|>the end of the play"]

OTHER_TEXT = "the end Transformers, xylophone 🦄 naïve 你好\r\n\t<|endoftext|>zephyrous ünd ÿ\n"
"""Words, characters and emoji the corpus never had, line breaks, a literal end-of-text."""


def compact_in_transformers(closed: bool, gpt2_encoding, tmp_path_factory: pytest.TempPathFactory):
    """A gpt2-compact vocabulary of CORPUS, the folder it was written to, transformers' tokenizer
    of it, and its tokenizer.json."""
    ours = CompactGPT2Tokenizer.from_texts(CORPUS, GPT2Tokenizer(gpt2_encoding), closed=closed)
    folder = tmp_path_factory.mktemp("compact")
    theirs = auto_tokenizer(ours, folder)
    return ours, folder, theirs, json.loads((folder / "tokenizer.json").read_text())


@pytest.fixture(scope="module")
def compact(gpt2_encoding, tmp_path_factory: pytest.TempPathFactory):
    """The current version, closed under GPT-2's merges."""
    return compact_in_transformers(True, gpt2_encoding, tmp_path_factory)


@pytest.fixture(scope="module")
def first(gpt2_encoding, tmp_path_factory: pytest.TempPathFactory):
    """The first version, which spells GPT-2 tokens outside its vocabulary in bytes."""
    return compact_in_transformers(False, gpt2_encoding, tmp_path_factory)


@pytest.mark.parametrize("version", ["compact", "first"])
def test_gpt2_compact_encodes_its_vocabulary_and_end_of_text_as_ours(
    version: str, request: pytest.FixtureRequest
) -> None:
    compact, _, theirs, hf_json = request.getfixturevalue(version)
    # "<|endoftext|>" in text is text to both; the end-of-text id decodes to it.
    text = TEXT + "one<|endoftext|>the end" + TEXT
    ids = theirs(text)["input_ids"]
    assert ids == compact.encode(text) and theirs.decode(ids) == text
    assert theirs.eos_token_id == compact.eot_id
    every_id = list(range(compact.n_vocab))
    assert theirs.decode(every_id) == compact.decode(every_id)
    # And back: the file gives our tokenizer's spec, for a model of the vocabulary's size.
    assert spec_from_hf_tokenizer_json(hf_json, compact.n_vocab) == compact.spec()


@pytest.mark.parametrize("text", [OTHER_TEXT, TEXT + OTHER_TEXT * 2, "Transformers", " 🦄", "<|endoftext|>"])
def test_gpt2_compact_encodes_and_decodes_any_text_as_ours(compact, text: str) -> None:
    """The closed vocabulary's BPE is the one tokenizer.json holds: the same ids on text made of
    words, characters and emoji the corpus never had too."""
    compact, _, theirs, _ = compact
    ids = theirs(text)["input_ids"]
    assert ids == compact.encode(text) and max(ids) < compact.eot_id
    assert theirs.decode(ids) == text == compact.decode(ids)


def test_gpt2_compact_goes_to_a_folder_and_back(compact, tmp_path: Path) -> None:
    """Export and import: our folder reads back to the same tokenizer, through our spec or, once
    transformers has saved it again without that, through tokenizer.json."""
    compact, folder, theirs, _ = compact
    assert tokenizer_spec_of(folder, compact.n_vocab) == compact.spec()
    theirs.save_pretrained(tmp_path / "again")
    assert not (tmp_path / "again" / "minigpt_tokenizer.json").exists()
    assert tokenizer_spec_of(tmp_path / "again", compact.n_vocab) == compact.spec()
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "again")
    assert again(OTHER_TEXT)["input_ids"] == compact.encode(OTHER_TEXT)
    # With a model: save_huggingface writes it, load_model reads the same tokenizer back.
    model = GPT(GPTConfig(vocab_size=compact.n_vocab, context_length=8, n_layer=1, n_head=1, n_embd=8))
    save_huggingface(model, compact, tmp_path / "model")
    _, loaded = load_model(tmp_path / "model")
    assert loaded.spec() == compact.spec() and loaded.encode(OTHER_TEXT) == compact.encode(OTHER_TEXT)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "model")
    assert hf(OTHER_TEXT)["input_ids"] == loaded.encode(OTHER_TEXT)


def test_the_first_gpt2_compact_gives_a_token_outside_its_vocabulary_an_id_the_model_lacks(first) -> None:
    """The first version spells a GPT-2 token the corpus never had in bytes; a `tokenizers` BPE
    cannot, and gives GPT-2's token an id from n_vocab on: never a different split into ids the
    model has. Models trained with it keep that spelling, and their tokenizer.json this limit."""
    compact, _, theirs, _ = first
    text = "the end Transformers"
    ours, hf = compact.encode(text), theirs(text)["input_ids"]
    assert len(ours) > len(hf)
    outside = [i for i in hf if i >= compact.n_vocab]
    assert outside and [i for i in hf if i < compact.n_vocab] == ours[: len(hf) - len(outside)]
