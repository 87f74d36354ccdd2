"""Tokenize a corpus once into memory-mappable ``train.bin`` / ``val.bin`` files, cached by content.

A prepared folder holds::

    train.bin   token ids, native-endian uint16 (vocabularies up to 65536 ids) or uint32
    val.bin     same dtype
    meta.json   format version, tokenizer spec, dtype, token counts, source description

Documents are tokenized separately and joined into one stream with the tokenizer's end-of-text id
between consecutive documents (when it has one). The *last* ``val_fraction`` of that stream is the
validation split. Splitting the token stream rather than whole documents works the same for one
large text (Shakespeare, where a document split would leave nothing) and for many small documents,
and validation windows never overlap training text.

Vocabularies that depend on the corpus are built from all of it, both splits: ``char`` from its
characters, ``gpt2-compact`` from its GPT-2 tokens. What happens is up to the tokenizer's registered
class (:class:`~minigpt.data.tokenizer.BaseTokenizer`): its ``corpus_encoder`` encodes the documents,
and its ``from_corpus_tokens`` may then read the final vocabulary off those tokens and return a map
that renumbers them as the splits are written; ``gpt2-compact`` does so, to run GPT-2's BPE once.

The folder name contains a hash of everything that determines its bytes (source content, tokenizer,
val_fraction, format version), so a second run with the same inputs returns at once and a changed
input never reuses stale tokens. The folder is written under a temporary name and renamed when
complete, so a crash never leaves a folder that looks valid.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .config import DataConfig
from .corpus import Corpus, resolve_corpus
from .errors import DataError
from .tokenizer import IdMap, Tokenizer, available_cores, tokenizer_class, tokenizer_from_spec

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
META_FILE = "meta.json"
SPLITS = ("train", "val")


@dataclass(frozen=True)
class PreparedData:
    """A complete prepared folder and its metadata."""

    directory: Path
    """The folder holding ``train.bin``, ``val.bin`` and ``meta.json``."""
    meta: dict[str, Any] = field(compare=False)
    """Contents of ``meta.json``."""

    @classmethod
    def open(cls, directory: Path) -> PreparedData:
        """Read and check a prepared folder.

        Raises:
            DataError: It is from another format version or its files do not match its metadata.
        """
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
        if meta.get("format_version") != FORMAT_VERSION:
            raise DataError(f"{directory} was prepared by another minigpt version; delete it and run again")
        prepared = cls(directory, meta)
        itemsize = np.dtype(meta["dtype"]).itemsize
        for split in SPLITS:
            path = directory / f"{split}.bin"
            if not path.is_file() or path.stat().st_size != prepared.num_tokens(split) * itemsize:
                raise DataError(f"{path} does not match {META_FILE}; delete {directory} and run again")
        return prepared

    def num_tokens(self, split: str) -> int:
        """Number of tokens in ``split`` ("train" or "val")."""
        return int(self.meta[f"{split}_tokens"])

    def tokens(self, split: str) -> np.ndarray:
        """Read-only memory map of ``split``'s token ids, shape ``(num_tokens(split),)``."""
        if self.num_tokens(split) == 0:
            return np.zeros(0, dtype=self.meta["dtype"])  # an empty file cannot be memory-mapped
        return np.memmap(self.directory / f"{split}.bin", dtype=self.meta["dtype"], mode="r")

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
            have = self.num_tokens(split)
            if have < needed:
                hint = "more text or a smaller context_length"
                if split == "val":
                    hint += " or a larger val_fraction"
                raise DataError(
                    f"the {split} split of {self.meta['source']} has {have} tokens but context_length"
                    f" {context_length} needs at least {needed}; use {hint}"
                )


def _cache_key(corpus: Corpus, config: DataConfig) -> str:
    parts = {
        "format_version": FORMAT_VERSION,
        "source": corpus.fingerprint,
        "tokenizer": tokenizer_class(config.tokenizer).cache_key(),
        "val_fraction": config.val_fraction,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _encode_documents(batch: pa.Table, indices: list[int], tokenizer: Tokenizer, last_index: int) -> pa.Table:
    """datasets.map function: one uint32 id list per document, end-of-text after all but the last.

    Works on Arrow tables in and out, so the ids go from numpy to Arrow without a Python-level copy.
    A null text (common in JSON and parquet data) is an empty document.
    """
    ids = tokenizer.encode_to_arrays([text or "" for text in batch.column("text").to_pylist()])
    if tokenizer.eot_id is not None:
        eot = np.array([tokenizer.eot_id], dtype=np.uint32)
        ids = [
            doc if index == last_index else np.concatenate([doc, eot])
            for doc, index in zip(ids, indices, strict=True)
        ]
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(doc) for doc in ids], out=offsets[1:])
    if offsets[-1] >= 2**31:  # Arrow list offsets are 32-bit
        raise DataError(
            f"documents {indices[0]}-{indices[-1]} hold over 2**31 tokens; split them into smaller files"
        )
    values = np.concatenate(ids) if ids else np.zeros(0, dtype=np.uint32)
    return pa.table({"ids": pa.ListArray.from_arrays(offsets.astype(np.int32), values)})


def _tokenize(
    dataset: datasets.Dataset, tokenizer: Tokenizer, num_proc: int, folder: Path, key: str
) -> pa.ChunkedArray:
    """Token ids of every document, as Arrow lists of uint32 in a file under ``folder``."""
    tokenized = dataset.with_format("arrow").map(
        _encode_documents,
        batched=True,
        with_indices=True,
        remove_columns=["text"],
        fn_kwargs={"tokenizer": tokenizer, "last_index": len(dataset) - 1},
        num_proc=min(num_proc, len(dataset)) if num_proc > 1 else None,
        cache_file_name=str(folder / "tokens.arrow"),
        new_fingerprint=key[:32],  # skips hashing the tokenizer; the key already names the work
        desc=f"tokenizing with {tokenizer.name}",
    )
    return tokenized.data.column("ids")


def _token_arrays(ids: pa.ChunkedArray) -> Iterator[np.ndarray]:
    """The token stream as numpy arrays, one per Arrow chunk, without copying."""
    for chunk in ids.chunks:
        yield chunk.flatten().to_numpy()


def _write_splits(
    ids: pa.ChunkedArray, num_train: int, dtype: np.dtype, folder: Path, map_ids: IdMap | None
) -> None:
    """Stream the ids into ``train.bin`` (the first ``num_train``) and ``val.bin`` (the rest),
    passed through ``map_ids`` when given."""
    with open(folder / "train.bin", "wb") as train, open(folder / "val.bin", "wb") as val:
        room = num_train
        for values in _token_arrays(ids):
            values = (values if map_ids is None else map_ids(values)).astype(dtype)
            head = min(room, len(values))
            values[:head].tofile(train)
            values[head:].tofile(val)
            room -= head


def _publish(tmp: Path, directory: Path, meta: dict[str, Any]) -> None:
    """Keep only the token files, add ``meta.json`` last, and rename the folder into place."""
    for path in tmp.iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        elif path.name not in ("train.bin", "val.bin"):
            path.unlink()
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    try:
        os.rename(tmp, directory)
    except OSError:
        if not (directory / META_FILE).is_file():
            raise
        shutil.rmtree(tmp)  # another process finished the same work first


def _build(corpus: Corpus, config: DataConfig, directory: Path, key: str) -> PreparedData:
    start = time.perf_counter()
    tmp = directory.parent / f".tmp-{directory.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        # datasets' Arrow copy of local files lives in the temporary folder and goes with it.
        dataset = corpus.load(tmp / "datasets")
        texts = (text or "" for batch in dataset.iter(batch_size=1000) for text in batch["text"])
        # Worker processes share the cores rather than each starting a thread per core.
        threads = max(1, available_cores() // config.num_proc)
        tokenizer_cls = tokenizer_class(config.tokenizer)
        encoder = tokenizer_cls.corpus_encoder(
            texts, tokenizer_path=config.tokenizer_path, num_threads=threads
        )
        ids = _tokenize(dataset, encoder, config.num_proc, tmp, key)
        tokenizer, map_ids = tokenizer_cls.from_corpus_tokens(encoder, _token_arrays(ids))
        total = int(pc.sum(pc.list_value_length(ids)).as_py() or 0)
        if total == 0:
            raise DataError(f"{corpus.description} contains no text")
        num_val = round(total * config.val_fraction)
        dtype = np.dtype(np.uint16 if tokenizer.n_vocab <= 1 << 16 else np.uint32)
        _write_splits(ids, total - num_val, dtype, tmp, map_ids)
        meta = {
            "format_version": FORMAT_VERSION,
            "source": corpus.description,
            "source_fingerprint": corpus.fingerprint,
            "tokenizer": tokenizer.spec(),
            "dtype": dtype.name,
            "train_tokens": total - num_val,
            "val_tokens": num_val,
            "documents": len(dataset),
            "text_bytes": int(pc.sum(pc.binary_length(dataset.data.column("text"))).as_py() or 0),
            "val_fraction": config.val_fraction,
        }
        del dataset, ids  # release the memory-mapped Arrow files before deleting them
        _publish(tmp, directory, meta)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    seconds = time.perf_counter() - start
    logger.info(
        "prepared %s: %d train + %d val tokens, %.1f MB of text in %.1f s (%.1f MB/s) -> %s",
        corpus.description,
        meta["train_tokens"],
        meta["val_tokens"],
        meta["text_bytes"] / 1e6,
        seconds,
        meta["text_bytes"] / 1e6 / seconds,
        directory,
    )
    return PreparedData.open(directory)


def prepare(
    config: DataConfig, cache_root: str | Path | None = None, context_length: int | None = None
) -> PreparedData:
    """Tokenize ``config.source`` into ``<cache_root>/<name>-<tokenizer>-<hash>/`` unless already there.

    Args:
        config: Source, tokenizer, val_fraction and num_proc are used.
        cache_root: Parent folder of prepared data; defaults to ``config.cache_dir``.
        context_length: When given, also check both splits can fill one window (see
            :meth:`PreparedData.require`).

    Raises:
        DataError: For any problem with the source, tokenizer or corpus size.
    """
    root = Path(config.cache_dir if cache_root is None else cache_root).expanduser().resolve()
    corpus = resolve_corpus(config.source, config.text_column, config.split)
    key = _cache_key(corpus, config)
    directory = root / f"{corpus.slug}-{config.tokenizer}-{key[:16]}"
    if (directory / META_FILE).is_file():
        logger.debug("using prepared data in %s", directory)
        prepared = PreparedData.open(directory)
    else:
        prepared = _build(corpus, config, directory, key)
    if context_length is not None:
        prepared.require(context_length)
    return prepared
