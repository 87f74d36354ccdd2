"""Typed settings for the data pipeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import DataError
from .tokenizer import TOKENIZERS, tokenizer_class

_TOKENIZER_OPTIONS = ("vocab_size", "special_tokens")


@dataclass(frozen=True)
class DataConfig:
    """Where the text comes from, how it is tokenized and cached, and how batches are drawn."""

    source: str = "shakespeare"
    """Corpus: "shakespeare" (built in), a .txt/.jsonl/.json/.parquet file or folder, or a hub dataset."""
    tokenizer: str = "gpt2"
    """Tokenizer: "gpt2" (GPT-2 BPE, 50257 ids), "gpt2-compact" (GPT-2 BPE renumbered over the tokens
    the corpus uses and those merged on the way to them: the same tokens on the corpus, a much
    smaller embedding and LM head), "char" (one id per character of the corpus), "bpe" (a
    byte-level BPE learned from the training split, vocab_size ids), or the name of any tokenizer
    registered with register_tokenizer."""
    vocab_size: int | None = None
    """Ids of a learned tokenizer (bpe): the 256 bytes, the special tokens and the merges learned
    (null: 4096, or fewer where the training text supports fewer, as a warning says). Other
    tokenizers take their size from their vocabulary."""
    special_tokens: tuple[str, ...] | None = None
    """Special tokens of a learned tokenizer (bpe), ids 0, 1, ...; the first separates documents
    (null: ["<|endoftext|>"])."""
    tokenizer_path: str | None = None
    """Path to GPT-2's r50k_base.tiktoken ranks file, for machines that cannot download it."""
    text_column: str = "text"
    """Column holding the text in .jsonl/.json/.parquet files and hub datasets."""
    split: str = "train"
    """Split of a hub dataset to read; validation text is always carved from it (see val_fraction)."""
    subset: str | None = None
    """Named configuration of a hub dataset, e.g. "sample-10BT" of HuggingFaceFW/fineweb."""
    streaming: bool = False
    """Stream a hub dataset's documents instead of downloading it whole first (local files are
    always read document by document)."""
    max_tokens: int | None = None
    """Token budget: prepare only the first max_tokens tokens of the corpus (None: all of it)."""
    shard_tokens: int = 1 << 27
    """Tokens per prepared shard file (2**27: 256 MB of uint16 ids); an interrupted preparation
    resumes after its last finished shard."""
    cache_dir: str = "data_cache"
    """Folder for prepared token files; a relative path is relative to the working directory."""
    val_fraction: float = 0.1
    """Share of the token stream, taken from its end, used for validation (0 < val_fraction < 1)."""
    val_tokens: int | None = 1 << 20
    """Tokens scored at each validation: fixed windows spread evenly over the validation split, the
    same in every run (None, or a split smaller than this: the whole split)."""
    batch_size: int = 16
    """Sequences per batch on each device."""
    num_workers: int = 0
    """DataLoader worker processes (0 reads in the training process)."""
    num_proc: int = 0
    """Threads that tokenize the corpus (tiktoken's batch encoding); 0 uses every available core."""
    seed: int = 1337
    """Seed for the random training-window offsets."""

    def __post_init__(self) -> None:
        if not self.source:
            raise DataError("data.source must not be empty")
        cls = tokenizer_class(self.tokenizer)  # DataError listing the registered names
        for option in _TOKENIZER_OPTIONS:
            if getattr(self, option) is not None and option not in cls.options:
                takers = ", ".join(name for name, c in TOKENIZERS.items() if option in c.options)
                raise DataError(
                    f"data.{option} is an option of learned tokenizers ({takers}), not {cls.name}"
                )
        cls.cache_key(**self.tokenizer_options())  # checks the options' values
        if not self.text_column:
            raise DataError("data.text_column must not be empty")
        check_batching(self, "data.")
        if self.num_proc < 0:
            raise DataError(f"data.num_proc must be 0 or more, got {self.num_proc}")
        if self.subset is not None and not self.subset:
            raise DataError("data.subset must be a hub dataset configuration name or null")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise DataError(f"data.max_tokens must be at least 1 or null, got {self.max_tokens}")
        if self.shard_tokens < 256:
            raise DataError(f"data.shard_tokens must be at least 256, got {self.shard_tokens}")
        if self.val_tokens is not None and self.val_tokens < 1:
            raise DataError(f"data.val_tokens must be at least 1 or null, got {self.val_tokens}")

    def tokenizer_options(self) -> dict[str, Any]:
        """The options the tokenizer is built with, by name (none for a tokenizer without options)."""
        return {option: getattr(self, option) for option in tokenizer_class(self.tokenizer).options}


WINDOWS = ("windows", 1)
"""What a batch of text or chat holds a row of: one window (`micro_batch`)."""


def micro_batch(batch_size: int, context_length: int, rows: tuple[str, int] = WINDOWS) -> tuple[int, str]:
    """The ids one process's batch holds, and how to say what it is: `batch_size` rows, each
    `rows[1]` windows of `context_length` tokens, a row named `rows[0]` ("16 pairs x 2 windows x
    128 tokens"). What the run summary prints and `tokens_per_step` divides by."""
    name, windows = rows
    each = f"{windows} windows x " if windows > 1 else ""
    return batch_size * windows * context_length, f"{batch_size} {name} x {each}{context_length} tokens"


class CountsBatches:
    """A data module's `micro_batch()`, from its `config.batch_size`, its `context_length` and
    `batch_rows`, what one row of its batches is (`micro_batch`)."""

    batch_rows = WINDOWS

    def micro_batch(self) -> tuple[int, str]:
        """The ids one process's batch holds, and what it is, for the summary and `tokens_per_step`."""
        return micro_batch(self.config.batch_size, self.context_length, self.batch_rows)  # type: ignore[attr-defined]


def check_batching(config: Any, prefix: str = "") -> None:
    """The settings every kind of data shares for holding out and batching what it reads:
    `val_fraction` (where `config` has one), `batch_size` and `num_workers`, each refused in one
    line that names it after `prefix` (`data.batch_size`)."""
    val_fraction = getattr(config, "val_fraction", None)
    if val_fraction is not None and not 0.0 < val_fraction < 1.0:
        raise DataError(f"{prefix}val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    if config.batch_size < 1:
        raise DataError(f"{prefix}batch_size must be at least 1, got {config.batch_size}")
    if config.num_workers < 0:
        raise DataError(f"{prefix}num_workers must be 0 or more, got {config.num_workers}")
