"""Tokenize a corpus once into memory-mappable token shards, cached by content, resumable.

The corpus is read as a stream of documents (:meth:`Corpus.batches`), tokenized a batch at a time
and written into shards of ``shard_tokens`` tokens (:mod:`minigpt.data.shards`), so memory holds
one batch of documents and their tokens however large the corpus is. Documents are joined into one
stream with the tokenizer's end-of-text id between consecutive documents (when it has one);
``max_tokens`` cuts the stream. The *last* ``val_fraction`` of the stream is the validation split.
Splitting the token stream rather than whole documents works the same for one large text
(Shakespeare) and for many small documents, and validation windows never overlap training text.

Vocabularies that depend on the corpus are read off it in the same single pass: the tokenizer's
registered class (:class:`~minigpt.data.tokenizer.BaseTokenizer`) names a ``corpus_encoder`` for the
documents (GPT-2's BPE for ``gpt2-compact``, code points for ``char``), and ``from_corpus_tokens``
then reads the final vocabulary off the finished shards and returns a map that renumbers them.

The folder name holds a hash of everything that determines its bytes (source content, tokenizer,
val_fraction, max_tokens, shard_tokens, format version), so a second run with the same inputs
returns at once and a changed input never reuses stale tokens. Work happens in a ``.partial-``
folder beside it, under a lock, so a second process waits and then reuses the result; the folder is
renamed into place with its ``meta.json`` when complete, so a crash never leaves one that looks valid.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from minigpt.common import WriteError, write_failure

from .config import DataConfig
from .corpus import Corpus, resolve_corpus
from .errors import DataError
from .prepared import FORMAT_VERSION, META_FILE, PreparedData
from .shards import Progress, ShardWriter, exclusive, iter_chunks, raw_shard
from .split import training_text
from .tokenizer import Tokenizer, available_cores, tokenizer_class, tokenizer_from_spec

logger = logging.getLogger(__name__)


def _dtype(n_vocab: int) -> np.dtype:
    return np.dtype(np.uint16 if n_vocab <= 1 << 16 else np.uint32)


def _cache_key(corpus: Corpus, config: DataConfig) -> str:
    parts = {
        "format_version": FORMAT_VERSION,
        "source": corpus.fingerprint,
        "tokenizer": tokenizer_class(config.tokenizer).cache_key(**config.tokenizer_options()),
        "val_fraction": config.val_fraction,
        "max_tokens": config.max_tokens,
        "shard_tokens": config.shard_tokens,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _token_batches(
    corpus: Corpus, encoder: Tokenizer, progress: Progress, budget: int | None
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """``(tokens, token ends, byte ends, first document)`` per batch, from where ``progress`` stopped.

    Ends are stream positions: each document's tokens (end-of-text first, for all but the first
    document) end at ``ends[i]``. The resumed document's tokens already in shards are dropped, and
    the stream stops at ``budget`` tokens.
    """
    eot = None if encoder.eot_id is None else np.array([encoder.eot_id], dtype=np.uint32)
    first, position, read = progress.documents, progress.tokens - progress.skip_tokens, progress.text_bytes
    skip = progress.skip_tokens
    for texts in corpus.batches(start=first):
        ids = encoder.encode_to_arrays(texts)
        if eot is not None:
            ids = [doc if first + i == 0 else np.concatenate([eot, doc]) for i, doc in enumerate(ids)]
        tokens = np.concatenate(ids) if ids else np.zeros(0, dtype=np.uint32)
        ends = position + np.cumsum([len(doc) for doc in ids], dtype=np.int64)
        byte_ends = read + np.cumsum([len(text.encode()) for text in texts], dtype=np.int64)
        tokens, position, read = tokens[skip:], int(ends[-1]), int(byte_ends[-1])
        if budget is not None and position >= budget:
            keep = int(np.searchsorted(ends, budget, side="left")) + 1  # documents reaching the budget
            yield (
                tokens[: len(tokens) - (position - budget)],
                np.minimum(ends[:keep], budget),
                byte_ends[:keep],
                first,
            )
            return
        yield tokens, ends, byte_ends, first
        first, skip = first + len(texts), 0


def _tokenize(
    corpus: Corpus, config: DataConfig, encoder: Tokenizer, folder: Path, progress: Progress
) -> None:
    """Write the corpus's shards into ``folder``, continuing ``progress``."""
    writer = ShardWriter(folder, _dtype(encoder.n_vocab), config.shard_tokens, progress)
    try:
        for tokens, ends, byte_ends, first in _token_batches(corpus, encoder, progress, config.max_tokens):
            writer.add(tokens, ends, byte_ends, first)
        writer.close()
    finally:
        writer.abort()  # the unfinished shard, if any, is never published


def _finalize(config: DataConfig, encoder: Tokenizer, folder: Path, progress: Progress) -> Tokenizer:
    """Turn the raw shards into ``shard-NNNNN.bin``: renumbered where the tokenizer reads its
    vocabulary off the corpus, else renamed. Resumable: a finished shard is never redone."""
    cls = tokenizer_class(config.tokenizer)
    count, raw_dtype = len(progress.shard_tokens), _dtype(encoder.n_vocab)
    final = [folder / f"shard-{i:05d}.bin" for i in range(count)]
    if progress.tokenizer is not None:  # every final shard exists; only the raw ones may remain
        tokenizer, map_ids = tokenizer_from_spec(progress.tokenizer, config.tokenizer_path), None
    else:
        sources = (raw_shard(folder, i) if raw_shard(folder, i).exists() else final[i] for i in range(count))
        tokenizer, map_ids = cls.from_corpus_tokens(
            encoder, (chunk for path in sources for chunk in iter_chunks(path, raw_dtype))
        )
        dtype = _dtype(tokenizer.n_vocab)
        for raw, done in zip((raw_shard(folder, i) for i in range(count)), final, strict=True):
            if done.exists():
                continue
            if map_ids is None and dtype == raw_dtype:
                os.replace(raw, done)
                continue
            tmp = done.with_suffix(".bin.tmp")
            with open(tmp, "wb") as out:
                for chunk in iter_chunks(raw, raw_dtype):
                    (chunk if map_ids is None else map_ids(chunk)).astype(dtype).tofile(out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, done)
        progress.tokenizer = tokenizer.spec()
        progress.save(folder)
    for i in range(count):
        raw_shard(folder, i).unlink(missing_ok=True)
    return tokenizer


def _validation_tokens(config: DataConfig, tokenizer: Tokenizer, folder: Path, progress: Progress) -> int:
    """``val_fraction`` of the stream's tokens, fewer where the tokenizer learned from text beyond
    that point: the validation split never holds text a vocabulary was learned from."""
    total, dtype = progress.tokens, _dtype(tokenizer.n_vocab)
    shards = (folder / f"shard-{i:05d}.bin" for i in range(len(progress.shard_tokens)))
    chunks = (chunk for path in shards for chunk in iter_chunks(path, dtype))
    keep = tokenizer_class(config.tokenizer).train_tokens_at_least(tokenizer, chunks)
    share = round(total * config.val_fraction)
    num_val = min(share, total - keep)
    if num_val < min(share, 1):
        raise DataError(
            f"the validation split of {config.source} is empty: all {total:,} tokens are text the"
            f" {config.tokenizer} tokenizer learned from; use more text or a larger val_fraction"
        )
    return num_val


def partial_folder(directory: Path) -> Path:
    """Where ``directory`` is prepared until it is complete."""
    return directory.parent / f".partial-{directory.name}"


def _build(corpus: Corpus, config: DataConfig, directory: Path) -> None:
    start = time.perf_counter()
    folder = partial_folder(directory)
    folder.mkdir(parents=True, exist_ok=True)
    progress = Progress.load(folder)
    finished = [
        raw_shard(folder, i).is_file() or (folder / f"shard-{i:05d}.bin").is_file()
        for i in range(len(progress.shard_tokens))
    ]
    if not all(finished):  # someone removed finished shards: start over rather than trust the record
        shutil.rmtree(folder)
        folder.mkdir()
        progress = Progress()
    if progress.shard_tokens:
        logger.info(
            "resuming the preparation of %s after shard %d", corpus.description, len(progress.shard_tokens)
        )
    threads = config.num_proc or available_cores()
    encoder = tokenizer_class(config.tokenizer).corpus_encoder(
        training_text(corpus, config.val_fraction, config.max_tokens),
        tokenizer_path=config.tokenizer_path,
        num_threads=threads,
        **config.tokenizer_options(),
    )
    if not progress.complete:
        _tokenize(corpus, config, encoder, folder, progress)
    total = progress.tokens
    if config.max_tokens is not None and total < config.max_tokens:
        shutil.rmtree(folder, ignore_errors=True)
        raise DataError(
            f"max_tokens {config.max_tokens:,} is more than {corpus.description} holds: {total:,}"
            f" {config.tokenizer} tokens; lower max_tokens or leave it unset"
        )
    if total == 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise DataError(f"{corpus.description} contains no text")
    tokenizer = _finalize(config, encoder, folder, progress)
    num_val = _validation_tokens(config, tokenizer, folder, progress)
    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "source": corpus.description,
        "source_fingerprint": corpus.fingerprint,
        "tokenizer": tokenizer.spec(),
        "dtype": _dtype(tokenizer.n_vocab).name,
        "shards": [{"file": f"shard-{i:05d}.bin", "tokens": n} for i, n in enumerate(progress.shard_tokens)],
        "train_tokens": total - num_val,
        "val_tokens": num_val,
        "documents": progress.documents,
        "text_bytes": progress.text_bytes,
        "val_fraction": config.val_fraction,
        "max_tokens": config.max_tokens,
    }
    (folder / "progress.json").unlink()
    (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    os.rename(folder, directory)
    seconds = time.perf_counter() - start
    logger.info(
        "prepared %s: %d train + %d val tokens in %d shards, %.1f MB of text in %.1f s -> %s",
        corpus.description,
        meta["train_tokens"],
        meta["val_tokens"],
        len(meta["shards"]),
        meta["text_bytes"] / 1e6,
        seconds,
        directory,
    )


def _locate(config: DataConfig, cache_root: str | Path | None) -> tuple[Corpus, Path]:
    root = Path(config.cache_dir if cache_root is None else cache_root).expanduser().resolve()
    corpus = resolve_corpus(config.source, config.text_column, config.split, config.subset, config.streaming)
    key = _cache_key(corpus, config)
    return corpus, root / f"{corpus.slug}-{config.tokenizer}-{key[:16]}"


def prepare(
    config: DataConfig, cache_root: str | Path | None = None, context_length: int | None = None
) -> PreparedData:
    """Tokenize ``config.source`` into ``<cache_root>/<name>-<tokenizer>-<hash>/`` unless already there.

    Args:
        config: Source, tokenizer, budget, shard size and val_fraction are used.
        cache_root: Parent folder of prepared data; defaults to ``config.cache_dir``.
        context_length: When given, also check both splits can fill one window (see
            :meth:`PreparedData.require`).

    Raises:
        DataError: For any problem with the source, tokenizer, budget or corpus size.
        WriteError: A full disk or a folder not the user's; a second call resumes after the shards done.
    """
    corpus, directory = _locate(config, cache_root)
    if not (directory / META_FILE).is_file():
        try:
            with exclusive(directory.parent / f".{directory.name}.lock"):
                if not (directory / META_FILE).is_file():  # another process may have finished it meanwhile
                    _build(corpus, config, directory)
        except OSError as error:
            if (failure := _cache_write_failure(error, directory.parent)) is None:
                raise
            partial = partial_folder(directory)
            done = len(Progress.load(partial).shard_tokens) if partial.is_dir() else 0
            note = f"run again to resume after shard {done}" if done else None
            raise WriteError(partial, failure, note=note) from error
    prepared = PreparedData.open(directory)
    if context_length is not None:
        prepared.require(context_length)
    return prepared


def _cache_write_failure(error: OSError, cache_root: Path) -> OSError | None:
    """The failure to write the cache behind `error` (a full disk, a folder not the user's); None
    for any other, such as a source file the user may not read."""
    failure = write_failure(error)
    named = None if failure is None or failure.filename is None else Path(os.fsdecode(failure.filename))
    return failure if named is None or named.absolute().is_relative_to(cache_root) else None


def open_prepared(
    config: DataConfig, cache_root: str | Path | None = None, context_length: int | None = None
) -> PreparedData:
    """The data :func:`prepare` made for ``config``, opened read-only; never writes.

    Raises:
        DataError: It has not been prepared, or a shard is missing or truncated.
    """
    corpus, directory = _locate(config, cache_root)
    if not (directory / META_FILE).is_file():
        raise DataError(f"{corpus.description} has not been prepared in {directory}; run prepare() first")
    prepared = PreparedData.open(directory)
    if context_length is not None:
        prepared.require(context_length)
    return prepared
