"""prepare(): token files with the right dtype and counts, exact round trips, caching and size checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from minigpt.data import (
    CharTokenizer,
    CompactGPT2Tokenizer,
    DataConfig,
    DataError,
    GPT2Tokenizer,
    PreparedData,
    prepare,
)
from minigpt.data.corpus import Corpus
from minigpt.data.prepare import _cache_key
from minigpt.data.tokenizer.char import CodePoints

DOCS = ["The first story.\nIt ends here.", "A second, shorter one 🙂", "Third: <|endoftext|> is just text."]


def _jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return path


def _all_tokens(prepared: PreparedData) -> np.ndarray:
    return np.concatenate([prepared.tokens("train"), prepared.tokens("val")])


def test_gpt2_documents_joined_by_endoftext(tmp_path: Path, data_cache: Path, gpt2: GPT2Tokenizer) -> None:
    config = DataConfig(source=str(_jsonl(tmp_path / "d.jsonl", DOCS)), val_fraction=0.25)
    prepared = prepare(config)
    assert prepared.directory.parent == data_cache  # config.cache_dir, relative to the working directory
    expected = [i for doc in DOCS for i in gpt2.encode(doc) + [50256]][:-1]
    tokens = _all_tokens(prepared)
    assert tokens.dtype == np.uint16 and prepared.meta["dtype"] == "uint16"
    assert tokens.tolist() == expected
    assert prepared.num_tokens("val") == round(len(expected) * 0.25)
    assert prepared.num_tokens("train") == len(expected) - prepared.num_tokens("val")
    assert gpt2.decode(tokens.tolist()) == "<|endoftext|>".join(DOCS)
    meta = json.loads((prepared.directory / "meta.json").read_text())
    assert meta["tokenizer"] == gpt2.spec() and meta["documents"] == 3 and meta["format_version"] == 2
    assert sorted(p.name for p in prepared.directory.iterdir()) == ["meta.json", "shard-00000.bin"]
    # No Arrow copies or partial folders left; the lock file stays for the next preparer.
    name = prepared.directory.name
    assert sorted(p.name for p in data_cache.iterdir()) == [f".{name}.lock", name]


def test_gpt2_compact_stores_compact_ids_of_gpt2s_tokens(
    tmp_path: Path, data_cache: Path, gpt2: GPT2Tokenizer
) -> None:
    source = str(_jsonl(tmp_path / "d.jsonl", DOCS))
    prepared = prepare(DataConfig(source=source, tokenizer="gpt2-compact", val_fraction=0.25))
    tokenizer = prepared.tokenizer()
    assert isinstance(tokenizer, CompactGPT2Tokenizer)
    expected = [i for doc in DOCS for i in gpt2.encode(doc) + [50256]][:-1]
    assert set(expected) | set(range(256)) < set(tokenizer.gpt2_ids.tolist())  # and tokens merged on the way
    assert tokenizer.closed and tokenizer.n_vocab == len(tokenizer.gpt2_ids)
    tokens = _all_tokens(prepared)
    assert tokens.dtype == np.uint16 and tokens.max() < tokenizer.n_vocab
    assert tokenizer.gpt2_ids[tokens].tolist() == expected  # the very same tokens, renumbered
    # ... which are also what the tokenizer's own (closed) BPE gives the documents.
    eot = [tokenizer.eot_id]
    assert tokens.tolist() == [i for doc in tokenizer.encode_to_arrays(DOCS) for i in doc.tolist() + eot][:-1]
    assert tokenizer.decode(tokens.tolist()) == "<|endoftext|>".join(DOCS)
    assert tokens.tolist().count(tokenizer.eot_id) == 2  # the literal "<|endoftext|>" in DOCS[2] is text
    assert prepared.meta["tokenizer"] == tokenizer.spec()
    assert "-gpt2-compact-" in prepared.directory.name
    assert prepare(DataConfig(source=source, val_fraction=0.25)).directory != prepared.directory
    two = prepare(
        DataConfig(source=source, tokenizer="gpt2-compact", val_fraction=0.25, num_proc=2), tmp_path / "2"
    )
    assert (
        _all_tokens(two).tolist() == tokens.tolist() and two.meta["tokenizer"] == prepared.meta["tokenizer"]
    )


def test_null_texts_are_empty_documents(tmp_path: Path, data_cache: Path, gpt2: GPT2Tokenizer) -> None:
    lines = ['{"text": "alpha"}', '{"text": null}', '{"text": "beta"}']
    (tmp_path / "n.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for tokenizer in ("gpt2", "gpt2-compact", "char"):
        prepared = prepare(DataConfig(source=str(tmp_path / "n.jsonl"), tokenizer=tokenizer))
        separator = "" if tokenizer == "char" else "<|endoftext|>"
        assert prepared.tokenizer().decode(_all_tokens(prepared).tolist()) == separator.join(
            ["alpha", "", "beta"]
        )


def test_char_text_file_round_trip(tmp_path: Path, data_cache: Path) -> None:
    text = "To be, or not to be: that is the question:\n" * 20
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    prepared = prepare(DataConfig(source=str(tmp_path / "t.txt"), tokenizer="char"))
    tokenizer = prepared.tokenizer()
    assert isinstance(tokenizer, CharTokenizer) and tokenizer.chars == "".join(sorted(set(text)))
    assert prepared.num_tokens("train") + prepared.num_tokens("val") == len(text)
    assert tokenizer.decode(_all_tokens(prepared).tolist()) == text
    # The validation split is the end of the stream.
    assert tokenizer.decode(prepared.tokens("val").tolist()) == text[-prepared.num_tokens("val") :]


def test_large_vocabulary_uses_uint32(tmp_path: Path, data_cache: Path) -> None:
    text = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 70_000) if not 0xD800 <= c < 0xE000)
    (tmp_path / "wide.txt").write_text(text, encoding="utf-8")
    prepared = prepare(DataConfig(source=str(tmp_path / "wide.txt"), tokenizer="char"))
    assert prepared.meta["dtype"] == "uint32" and prepared.tokens("train").dtype == np.uint32
    assert _all_tokens(prepared).max() > 65535
    assert prepared.tokenizer().decode(_all_tokens(prepared).tolist()) == text


def test_second_call_is_a_cache_hit(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _jsonl(tmp_path / "d.jsonl", DOCS)
    first = prepare(DataConfig(source=str(source), tokenizer="char"))

    def refuse(*args: object) -> None:
        raise AssertionError("re-tokenized on a cache hit")

    monkeypatch.setattr(CharTokenizer, "encode_to_arrays", refuse)
    monkeypatch.setattr(CharTokenizer, "__init__", refuse)
    second = prepare(DataConfig(source=str(source), tokenizer="char"))
    assert second.directory == first.directory and second.meta == first.meta


def test_inputs_that_change_the_bytes_change_the_folder(tmp_path: Path, data_cache: Path) -> None:
    source = _jsonl(tmp_path / "d.jsonl", DOCS)
    base = prepare(DataConfig(source=str(source), tokenizer="char")).directory
    assert prepare(DataConfig(source=str(source), tokenizer="char", val_fraction=0.2)).directory != base
    corpus = Corpus("a corpus", "corpus", "f" * 64)  # the tokenizer, without fetching GPT-2's ranks
    assert _cache_key(corpus, DataConfig(tokenizer="gpt2")) != _cache_key(
        corpus, DataConfig(tokenizer="char")
    )
    _jsonl(source, DOCS[:2])
    assert prepare(DataConfig(source=str(source), tokenizer="char")).directory != base


def test_too_short_split_says_how_many_tokens(tmp_path: Path, data_cache: Path) -> None:
    (tmp_path / "t.txt").write_text("abcdefghij" * 10, encoding="utf-8")
    config = DataConfig(source=str(tmp_path / "t.txt"), tokenizer="char", val_fraction=0.1)
    with pytest.raises(
        DataError, match="the val split of .* has 10 tokens but context_length 32 needs at least 33"
    ):
        prepare(config, context_length=32)
    with pytest.raises(
        DataError, match="the train split of .* has 90 tokens but context_length 128 needs at least 129"
    ):
        prepare(config, context_length=128)
    prepare(config, context_length=9)


def test_empty_text_is_rejected(tmp_path: Path, data_cache: Path) -> None:
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="contains no text|has no rows|the corpus is empty"):
        prepare(DataConfig(source=str(tmp_path / "empty.txt"), tokenizer="char"))


def test_failure_leaves_no_folder_that_looks_prepared(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(*args: object) -> None:
        raise RuntimeError("crash mid-tokenization")

    config = DataConfig(source=str(_jsonl(tmp_path / "d.jsonl", DOCS)), tokenizer="char")
    with monkeypatch.context() as patch:
        patch.setattr(CodePoints, "encode_to_arrays", crash)
        with pytest.raises(RuntimeError, match="crash mid-tokenization"):
            prepare(config)
    # Only the lock and the partial folder (kept to resume from) are there, no meta.json anywhere.
    assert all(p.name.startswith(".") for p in data_cache.iterdir())
    assert not list(data_cache.rglob("meta.json")) and not list(data_cache.rglob("*.bin.tmp"))
    assert CharTokenizer.from_spec(prepare(config).meta["tokenizer"]).decode(
        _all_tokens(prepare(config)).tolist()
    ) == "".join(DOCS)


def test_tampered_folder_is_detected(tmp_path: Path, data_cache: Path) -> None:
    config = DataConfig(source=str(_jsonl(tmp_path / "d.jsonl", DOCS)), tokenizer="char")
    prepared = prepare(config)
    with open(prepared.directory / "shard-00000.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(DataError, match="shard .*shard-00000.bin has .* bytes but meta.json says .*; delete"):
        prepare(config)


def test_several_processes_give_the_same_tokens(tmp_path: Path, gpt2: GPT2Tokenizer) -> None:
    source = str(_jsonl(tmp_path / "d.jsonl", DOCS * 4))
    one = prepare(DataConfig(source=source), tmp_path / "one")
    two = prepare(DataConfig(source=source, num_proc=2), tmp_path / "two")
    assert _all_tokens(two).tolist() == _all_tokens(one).tolist()


@pytest.mark.parametrize(
    ("tokenizer", "key"),
    [
        ("gpt2", "f1721cd7250a66179ae962aeacab75023ed0f832e4a766a733a4785cbadf0d88"),
        ("gpt2-compact", "3c4e25b33523ad14e4f40355a50aca18e25a6525e543afccef6443766e447466"),
        ("char", "fcf081e95beb0ccb3a57003e11c0e7c709a968f968f4002fc356d54aac2a6816"),
    ],
)
def test_cache_keys_of_the_builtin_tokenizers_are_stable(tokenizer: str, key: str) -> None:
    """A changed key strands every folder users have prepared; change it only with FORMAT_VERSION
    or with a new version of the tokenizer (gpt2-compact's closed vocabulary numbers the same
    corpus tokens differently, so folders of the first version must not be reused)."""
    corpus = Corpus("a corpus", "corpus", "f" * 64)
    assert _cache_key(corpus, DataConfig(tokenizer=tokenizer, val_fraction=0.25)) == key
