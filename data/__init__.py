"""Text data for minigpt: corpora, tokenizers, prepared token files and the LightningDataModule."""

from .config import DataConfig
from .datamodule import TextDataModule
from .errors import DataError
from .gpt2_encoding import load_gpt2_encoding
from .prepare import PreparedData, prepare
from .tokenizer import CharTokenizer, GPT2Tokenizer, Tokenizer, build_tokenizer, tokenizer_from_spec

__all__ = [
    "CharTokenizer",
    "DataConfig",
    "DataError",
    "GPT2Tokenizer",
    "PreparedData",
    "TextDataModule",
    "Tokenizer",
    "build_tokenizer",
    "load_gpt2_encoding",
    "prepare",
    "tokenizer_from_spec",
]
