import hashlib
import stat
from pathlib import Path

import pytest

from minigpt.common import atomic_write, one_line, sha256_file


def test_atomic_write_replaces_the_file_only_when_the_block_succeeds(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "weights.bin"
    with atomic_write(target) as tmp:
        assert tmp.parent == target.parent and tmp != target
        tmp.write_bytes(b"first")
    assert target.read_bytes() == b"first"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644

    with pytest.raises(RuntimeError), atomic_write(target) as tmp:
        tmp.write_bytes(b"half-writ")
        raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"first"
    assert [p.name for p in target.parent.iterdir()] == ["weights.bin"]  # no temporary file left


def test_sha256_file_matches_hashlib_and_shows_every_chunk(tmp_path: Path) -> None:
    data = bytes(range(256)) * 41
    path = tmp_path / "blob"
    path.write_bytes(data)
    chunks: list[bytes] = []
    assert sha256_file(path, chunks.append, chunk_size=1000) == hashlib.sha256(data).hexdigest()
    assert b"".join(chunks) == data
    assert chunks[-1] == b"" and all(len(c) == 1000 for c in chunks[:-2])


def test_one_line_folds_messages_and_can_name_the_root_cause() -> None:
    assert one_line(ValueError("usage:\n  --checkpoint is required\n\n")) == "usage: --checkpoint is required"
    assert one_line(TimeoutError()) == "TimeoutError"
    assert one_line(OSError("no route"), with_type=True) == "OSError: no route"
    try:
        try:
            raise FileNotFoundError("corpus.parquet is missing")
        except FileNotFoundError as inner:
            raise RuntimeError("An error occurred while generating the dataset") from inner
    except RuntimeError as outer:
        assert one_line(outer, root_cause=True) == "corpus.parquet is missing"


def test_duration_reads_as_a_person_would_say_it() -> None:
    from minigpt.common import duration

    assert [duration(s) for s in (9.6, 515, 7500)] == ["10 s", "8 min 35 s", "2 h 5 min"]


def test_data_settings_reads_a_run_config_with_or_without_the_data_modules_class() -> None:
    from minigpt.common import data_settings

    settings = {"config": {"source": "play.txt", "batch_size": 4}}
    named = {"data": {"class_path": "minigpt.data.datamodule.TextDataModule", "init_args": settings}}
    assert data_settings(named) == settings
    assert data_settings({"data": settings}) == settings  # a run saved before the class was named
    assert data_settings({}) == {}
