"""Resolving and loading sources: local files of each kind, folders, and the errors users can cause."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import huggingface_hub.constants
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from minigpt.data import DataError
from minigpt.data.corpus import _hash_file, resolve_corpus


def _texts(source: Path, text_column: str = "text") -> list[str]:
    return list(resolve_corpus(str(source), text_column).texts())


def test_txt_file_is_one_document_with_normalised_line_ends(tmp_path: Path) -> None:
    text = "First line\n\n  indented \t\r\nlast line without newline"
    (tmp_path / "a.txt").write_bytes(text.encode("utf-8"))
    assert _texts(tmp_path / "a.txt") == [text.replace("\r\n", "\n")]


def test_jsonl_rows_are_documents_with_chosen_column(tmp_path: Path) -> None:
    rows = [{"body": "one", "id": 1}, {"body": "two\nlines", "id": 2}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert _texts(tmp_path / "d.jsonl", "body") == ["one", "two\nlines"]
    with pytest.raises(DataError, match=r"has no column 'text' \(columns: body, id\); set text_column"):
        _texts(tmp_path / "d.jsonl")
    with pytest.raises(DataError, match="holds .* not text"):
        _texts(tmp_path / "d.jsonl", "id")


def test_parquet_file(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": ["alpha", "beta"]}), tmp_path / "p.parquet")
    assert _texts(tmp_path / "p.parquet") == ["alpha", "beta"]


def test_folder_of_text_files_in_sorted_order(tmp_path: Path) -> None:
    folder = tmp_path / "books"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("bee", encoding="utf-8")
    (folder / "a.txt").write_text("ay", encoding="utf-8")
    (folder / "sub" / "c.txt").write_text("sea", encoding="utf-8")
    (folder / "notes.md").write_text("ignored", encoding="utf-8")
    assert _texts(folder) == ["ay", "bee", "sea"]


def test_fingerprint_follows_content(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("one", encoding="utf-8")
    first = resolve_corpus(str(path)).fingerprint
    assert resolve_corpus(str(path)).fingerprint == first
    path.write_text("two", encoding="utf-8")
    assert resolve_corpus(str(path)).fingerprint != first


@pytest.mark.parametrize("source", ["missing.txt", "./missing", "/no/such/folder/x.jsonl"])
def test_missing_path(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        resolve_corpus(source)


def test_unusable_folders(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="contains no .txt/.jsonl/.json/.parquet files"):
        resolve_corpus(str(tmp_path / "empty"))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.txt").write_text("a", encoding="utf-8")
    (mixed / "b.jsonl").write_text('{"text": "b"}\n', encoding="utf-8")
    with pytest.raises(DataError, match="mixes file kinds"):
        resolve_corpus(str(mixed))


def test_empty_jsonl_has_no_rows(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(DataError):
        _texts(tmp_path / "e.jsonl")


def test_non_utf8_names_file_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("café au lait ".encode() + "crème".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt is not UTF-8: byte 0xe8 at offset 16; convert it"):
        resolve_corpus(str(path))


def test_utf8_check_across_chunk_boundaries(tmp_path: Path) -> None:
    path = tmp_path / "u.txt"
    path.write_bytes("é🙂".encode() * 5 + b"\xff")  # multi-byte characters straddle every 3-byte chunk
    with pytest.raises(DataError, match="byte 0xff at offset 30"):
        _hash_file(path, check_utf8=True, chunk_size=3)
    path.write_bytes("é🙂".encode() * 5 + "🙂".encode()[:2])  # truncated at the end of the file
    with pytest.raises(DataError, match="byte 0xf0 at offset 30"):
        _hash_file(path, check_utf8=True, chunk_size=3)
    path.write_bytes("é🙂".encode() * 5)
    _hash_file(path, check_utf8=True, chunk_size=3)


def test_hub_dataset_offline_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Offline mode makes the hub client fail at once instead of retrying for ~25 s.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        DataError, match=r"could not load hub dataset 'roneneldan/TinyStories' \(split 'train'\)"
    ):
        resolve_corpus("roneneldan/TinyStories")
