"""Text data for minigpt: corpora, tokenizers, prepared token files and the LightningDataModule.

`TextDataModule`, `ChatDataModule` and `PreferenceDataModule` are imported on first use: they need
Lightning, which the commands that only read a model (generate, export, visualize, evaluate,
serve) would otherwise import at start-up.
"""

from typing import Any

from .config import DataConfig
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
    spec_from_hf_tokenizer_json,
    tokenizer_from_spec,
)
from .windows import TokenWindows, TrainWindowSampler

__all__ = [
    "BPETokenizer",
    "BaseTokenizer",
    "CharTokenizer",
    "ChatDataModule",
    "CompactGPT2Tokenizer",
    "DataConfig",
    "DataError",
    "GPT2Tokenizer",
    "PreferenceDataModule",
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
    "spec_from_hf_tokenizer_json",
    "tokenizer_from_spec",
]


def __getattr__(name: str) -> Any:
    if name == "TextDataModule":
        from .datamodule import TextDataModule

        return TextDataModule
    if name == "ChatDataModule":
        from .chat.datamodule import ChatDataModule

        return ChatDataModule
    if name == "PreferenceDataModule":
        from .preference.datamodule import PreferenceDataModule

        return PreferenceDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
