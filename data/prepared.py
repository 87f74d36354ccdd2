"""A prepared folder: token shards, and the train/validation splits as pieces of them.

A prepared folder holds::

    shard-00000.bin, shard-00001.bin, ...   token ids, native-endian uint16 (up to 65536 ids) or uint32;
                                            data.shard_tokens tokens each, the last one shorter
    meta.json                               format version, tokenizer spec, dtype, the shards and
                                            their token counts, the split point, the source

The shards hold the corpus as one token stream. The first ``train_tokens`` tokens of it are the
training split and the rest the validation split, so a split is a list of :class:`Segment` s,
pieces of shards; windows are cut within one segment and never span two files or two splits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataError
from .tokenizer import Tokenizer, tokenizer_from_spec

FORMAT_VERSION = 2
META_FILE = "meta.json"
SPLITS = ("train", "val")


@dataclass(frozen=True)
class Segment:
    """Tokens ``[start, stop)`` of one shard file."""

    path: Path
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class PreparedData:
    """A complete prepared folder and its metadata."""

    directory: Path
    """The folder holding the shards and ``meta.json``."""
    meta: dict[str, Any] = field(compare=False)
    """Contents of ``meta.json``."""

    @classmethod
    def open(cls, directory: Path) -> PreparedData:
        """Read a prepared folder and check every shard is there with its full size.

        Raises:
            DataError: It is from another format version, or a shard is missing or has another size.
        """
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
        if meta.get("format_version") != FORMAT_VERSION:
            raise DataError(f"{directory} was prepared by another minigpt version; delete it and run again")
        itemsize = np.dtype(meta["dtype"]).itemsize
        for shard in meta["shards"]:
            path = directory / shard["file"]
            expected = shard["tokens"] * itemsize
            if not path.is_file():
                raise DataError(f"shard {path} is missing; delete {directory} and prepare the data again")
            if path.stat().st_size != expected:
                raise DataError(
                    f"shard {path} has {path.stat().st_size} bytes but {META_FILE} says {expected};"
                    f" delete {directory} and prepare the data again"
                )
        return cls(directory, meta)

    def num_tokens(self, split: str) -> int:
        """Number of tokens in ``split`` ("train" or "val")."""
        return int(self.meta[f"{split}_tokens"])

    def segments(self, split: str) -> list[Segment]:
        """``split``'s tokens as pieces of shards, in stream order (empty pieces left out)."""
        begin, end = (0, self.num_tokens("train")) if split == "train" else (self.num_tokens("train"), None)
        end = self.num_tokens("train") + self.num_tokens("val") if end is None else end
        pieces, offset = [], 0
        for shard in self.meta["shards"]:
            lo, hi = max(begin, offset), min(end, offset + shard["tokens"])
            if lo < hi:
                pieces.append(Segment(self.directory / shard["file"], lo - offset, hi - offset))
            offset += shard["tokens"]
        return pieces

    def tokens(self, split: str) -> np.ndarray:
        """``split``'s token ids, ``(num_tokens(split),)``: a read-only memory map when they lie in one
        shard, else a copy in memory (for tools on small corpora; training reads windows instead)."""
        dtype = self.meta["dtype"]
        arrays = [np.memmap(s.path, dtype=dtype, mode="r")[s.start : s.stop] for s in self.segments(split)]
        if len(arrays) == 1:
            return arrays[0]
        return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)

    def tokenizer(self, tokenizer_path: str | None = None) -> Tokenizer:
        """The tokenizer the files were written with."""
        return tokenizer_from_spec(self.meta["tokenizer"], tokenizer_path)

    def require(self, context_length: int) -> None:
        """Check both splits hold at least one window of ``context_length`` inputs plus its target.

        Raises:
            DataError: A split is too short; the message gives its size and the size needed.
        """
        needed = context_length + 1
        for split in SPLITS:
            have = max((len(s) for s in self.segments(split)), default=0)
            if have < needed:
                hint = "more text or a smaller context_length"
                if split == "val":
                    hint += " or a larger val_fraction"
                if len(self.segments(split)) > 1:
                    hint += " or a larger shard_tokens"
                raise DataError(
                    f"the {split} split of {self.meta['source']} has {self.num_tokens(split)} tokens but"
                    f" context_length {context_length} needs at least {needed} in one shard; use {hint}"
                )
