"""Typed settings for the data pipeline."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DataError
from .tokenizer import tokenizer_class


@dataclass(frozen=True)
class DataConfig:
    """Where the text comes from, how it is tokenized and cached, and how batches are drawn."""

    source: str = "shakespeare"
    """Corpus: "shakespeare" (built in), a .txt/.jsonl/.json/.parquet file or folder, or a hub dataset."""
    tokenizer: str = "gpt2"
    """Tokenizer: "gpt2" (GPT-2 BPE, 50257 ids), "gpt2-compact" (GPT-2 BPE renumbered over the tokens
    the corpus uses: the same tokens, a much smaller embedding and LM head), "char" (one id per
    character of the corpus), or the name of any tokenizer registered with register_tokenizer."""
    tokenizer_path: str | None = None
    """Path to GPT-2's r50k_base.tiktoken ranks file, for machines that cannot download it."""
    text_column: str = "text"
    """Column holding the text in .jsonl/.json/.parquet files and hub datasets."""
    split: str = "train"
    """Split of a hub dataset to read; validation text is always carved from it (see val_fraction)."""
    cache_dir: str = "data_cache"
    """Folder for prepared token files; a relative path is relative to the working directory."""
    val_fraction: float = 0.1
    """Share of the token stream, taken from its end, used for validation (0 < val_fraction < 1)."""
    batch_size: int = 16
    """Sequences per batch on each device."""
    num_workers: int = 0
    """DataLoader worker processes (0 reads in the training process)."""
    num_proc: int = 1
    """Processes used to tokenize the corpus (datasets.map num_proc)."""
    seed: int = 1337
    """Seed for the random training-window offsets."""

    def __post_init__(self) -> None:
        if not self.source:
            raise DataError("data.source must not be empty")
        tokenizer_class(self.tokenizer)  # DataError listing the registered names
        if not self.text_column:
            raise DataError("data.text_column must not be empty")
        if not 0.0 < self.val_fraction < 1.0:
            raise DataError(f"data.val_fraction must be between 0 and 1 (exclusive), got {self.val_fraction}")
        if self.batch_size < 1:
            raise DataError(f"data.batch_size must be at least 1, got {self.batch_size}")
        if self.num_workers < 0:
            raise DataError(f"data.num_workers must be 0 or more, got {self.num_workers}")
        if self.num_proc < 1:
            raise DataError(f"data.num_proc must be at least 1, got {self.num_proc}")
