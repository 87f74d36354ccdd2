"""Text data for minigpt: corpora, tokenizers, prepared token files and the LightningDataModule."""

from .config import DataConfig
from .datamodule import TextDataModule
from .errors import DataError
from .gpt2_encoding import load_gpt2_encoding
from .loader import ResumableLoader
from .prepare import open_prepared, prepare
from .prepared import PreparedData, Segment
from .tokenizer import (
    BaseTokenizer,
    BPETokenizer,
    CharTokenizer,
    CompactGPT2Tokenizer,
    GPT2Tokenizer,
    Tokenizer,
    build_tokenizer,
    register_tokenizer,
    tokenizer_from_spec,
)
from .windows import TokenWindows, TrainWindowSampler

__all__ = [
    "BPETokenizer",
    "BaseTokenizer",
    "CharTokenizer",
    "CompactGPT2Tokenizer",
    "DataConfig",
    "DataError",
    "GPT2Tokenizer",
    "PreparedData",
    "ResumableLoader",
    "Segment",
    "TextDataModule",
    "TokenWindows",
    "Tokenizer",
    "TrainWindowSampler",
    "build_tokenizer",
    "load_gpt2_encoding",
    "open_prepared",
    "prepare",
    "register_tokenizer",
    "tokenizer_from_spec",
]
