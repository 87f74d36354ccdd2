"""`train_tokenizer.py`: learn a byte-level BPE from any source and inspect it (or inspect any other
tokenizer on the same text), to choose a vocabulary size before training."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from minigpt.common import UsageError, safe_write
from minigpt.data import BPETokenizer, DataConfig, Tokenizer, build_tokenizer
from minigpt.data.corpus import Corpus, resolve_corpus
from minigpt.data.split import training_text, validation_text

from .command import USER_ERRORS, options_parser, parse_options, report


@dataclass(frozen=True)
class TokenizerOptions:
    """The text, the tokenizer, and what to show and save."""

    source: str = "shakespeare"
    """Corpus, as data.source: "shakespeare", a .txt/.jsonl/.json/.parquet file or folder, or a hub
    dataset."""
    tokenizer: str = "bpe"
    """bpe (learned here), or any other registered tokenizer (gpt2, gpt2-compact, char) to compare."""
    vocab_size: int | None = None
    """bpe: ids in the vocabulary (null: 4096), as data.vocab_size."""
    special_tokens: tuple[str, ...] | None = None
    """bpe: special tokens, as data.special_tokens (null: ["<|endoftext|>"])."""
    text_column: str = "text"
    """Column holding the text in .jsonl/.json/.parquet files and hub datasets."""
    split: str = "train"
    """Split of a hub dataset to read."""
    subset: str | None = None
    """Named configuration of a hub dataset."""
    val_fraction: float = 0.1
    """As data.val_fraction: bpe learns from the text before the last val_fraction of the bytes,
    and bytes per token are measured on that last part."""
    max_tokens: int | None = None
    """As data.max_tokens: bpe learns from (1 - val_fraction) x max_tokens bytes at most."""
    longest: int = 12
    """How many of the longest tokens to show."""
    sample: str | None = None
    """Text to show split into tokens (null: the start of the validation text)."""
    save: str | None = None
    """bpe: write the tokenizer here as a Hugging Face tokenizer.json."""
    force: bool = False
    """Replace --save if it exists."""

    def data_config(self) -> DataConfig:
        """The same choices as training's data settings, checked the same way."""
        return DataConfig(
            source=self.source,
            tokenizer=self.tokenizer,
            vocab_size=self.vocab_size,
            special_tokens=self.special_tokens,
            text_column=self.text_column,
            split=self.split,
            subset=self.subset,
            val_fraction=self.val_fraction,
            max_tokens=self.max_tokens,
        )


def _shown(piece: bytes, quoted: bool = False) -> str:
    """A token's bytes on one line: escapes for line breaks, tabs and partial characters."""
    text = repr(piece.decode("utf-8", errors="backslashreplace"))
    return text if quoted else text[1:-1]


def _token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    if isinstance(tokenizer, BPETokenizer):
        return tokenizer.token_bytes()
    return [tokenizer.decode([i]).encode("utf-8") for i in range(tokenizer.n_vocab)]


def _build(opts: TokenizerOptions, config: DataConfig, corpus: Corpus) -> tuple[Tokenizer, str]:
    """The tokenizer, and a line saying what it was made from."""
    if opts.tokenizer == "bpe":
        tokenizer = BPETokenizer.learn(
            training_text(corpus, config.val_fraction, config.max_tokens),
            config.vocab_size,
            config.special_tokens,
        )
        return tokenizer, f"learned from the first {tokenizer.learned_bytes:,} bytes of {corpus.description}"
    return build_tokenizer(opts.tokenizer, texts=corpus.texts()), f"built for {corpus.description}"


def train_tokenizer_main(args: Sequence[str] | None = None) -> int:
    """Parse the command line, build the tokenizer, print what it does to the text. Returns the exit code."""
    parser = options_parser(
        "train_tokenizer.py", "Learn a byte-level BPE from a corpus and inspect it.", TokenizerOptions
    )
    try:
        (opts,) = parse_options(parser, args, TokenizerOptions)
        config = opts.data_config()
        save = Path(opts.save) if opts.save else None
        if save is not None and opts.tokenizer != "bpe":
            raise UsageError(f"--save writes a learned tokenizer; {opts.tokenizer} is not learned")
        if save is not None and save.exists() and not opts.force:
            raise UsageError(f"{save} already exists; pass --force to replace it")
        if opts.longest < 0:
            raise UsageError(f"--longest must be 0 or more, got {opts.longest}")
        corpus = resolve_corpus(config.source, config.text_column, config.split, config.subset)
        start = time.perf_counter()
        tokenizer, origin = _build(opts, config, corpus)
        seconds = time.perf_counter() - start
        val_bytes = val_tokens = 0
        sample = opts.sample
        for text in validation_text(corpus, config.val_fraction, config.max_tokens):
            sample = text[:200] if sample is None else sample
            val_bytes += len(text.encode("utf-8"))
            val_tokens += len(tokenizer.encode(text))
    except USER_ERRORS as err:
        return report(err)
    print(f"{tokenizer.name}: {tokenizer.n_vocab:,} ids, {origin} in {seconds:.1f} s")
    if val_tokens:
        rate = val_bytes / val_tokens
        print(f"validation text: {val_bytes:,} bytes -> {val_tokens:,} tokens, {rate:.2f} bytes/token")
    pieces = _token_bytes(tokenizer)
    if opts.longest:
        special = set(getattr(tokenizer, "special_tokens", {})) | {tokenizer.eot_id}
        ordinary = [i for i in range(len(pieces)) if i not in special]
        longest = sorted(ordinary, key=lambda i: (-len(pieces[i]), i))[: opts.longest]
        print("longest tokens: " + ", ".join(f"{_shown(pieces[i], quoted=True)}" for i in longest))
    if sample:
        ids = tokenizer.encode(sample)
        print(f"sample, {len(sample.encode('utf-8'))} bytes in {len(ids)} tokens:")
        print("|".join(_shown(pieces[i]) for i in ids))
    if save is not None and isinstance(tokenizer, BPETokenizer):
        try:
            with safe_write(save, option="--save") as tmp:
                tmp.write_text(tokenizer.hf_tokenizer_json(), encoding="utf-8")
        except USER_ERRORS as err:
            return report(err)
        print(f"wrote {save} (tokenizers.Tokenizer.from_file reads it)")
    return 0
