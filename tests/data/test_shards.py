"""Sharded preparation: shard layout, budgets, resuming after a full disk, damaged shards, one preparer."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minigpt.common import WriteError
from minigpt.data import DataConfig, DataError, TextDataModule, prepare
from minigpt.data.shards import ShardWriter

# 60 documents: about 8,600 char tokens (34 shards of 256) or 1,900 GPT-2 tokens (8 shards).
DOCS = [f"Document {i}: " + "the quick brown fox jumps over the lazy dog " * (2 + i % 3) for i in range(60)]
TEXT = "".join(DOCS)


@pytest.fixture
def source(tmp_path: Path, data_cache: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS), encoding="utf-8")
    return path


def _stream(prepared) -> np.ndarray:
    return np.concatenate([prepared.tokens("train"), prepared.tokens("val")])


def test_shards_hold_the_same_stream_as_one_file(source: Path, tmp_path: Path) -> None:
    whole = prepare(DataConfig(source=str(source), tokenizer="char"), tmp_path / "one")
    sharded = prepare(DataConfig(source=str(source), tokenizer="char", shard_tokens=256), tmp_path / "many")
    sizes = [s["tokens"] for s in sharded.meta["shards"]]
    assert len(whole.meta["shards"]) == 1 and len(sizes) == -(-len(TEXT) // 256)
    assert all(n == 256 for n in sizes[:-1]) and sum(sizes) == len(TEXT)
    assert sharded.meta["tokenizer"] == whole.meta["tokenizer"]  # the vocabulary read off every shard
    assert _stream(sharded).tolist() == _stream(whole).tolist()
    assert sharded.tokenizer().decode(_stream(sharded).tolist()) == TEXT


def test_budget_cuts_the_stream_and_a_budget_beyond_the_corpus_says_how_much_there_is(
    source: Path, tmp_path: Path
) -> None:
    whole = prepare(DataConfig(source=str(source), tokenizer="char"))
    cut = prepare(DataConfig(source=str(source), tokenizer="char", max_tokens=1000, shard_tokens=256))
    assert cut.num_tokens("train") + cut.num_tokens("val") == 1000
    assert cut.tokenizer().decode(_stream(cut).tolist()) == TEXT[:1000]
    assert cut.meta["documents"] == len(TEXT[:1000].split("Document ")) - 1  # the last one cut short
    assert whole.directory != cut.directory
    with pytest.raises(
        DataError, match=f"max_tokens 100,000 is more than .* holds: {len(TEXT):,} char tokens"
    ):
        prepare(DataConfig(source=str(source), tokenizer="char", max_tokens=100_000))
    assert not [p for p in (tmp_path / "data_cache").iterdir() if p.name.startswith(".partial")]


@pytest.mark.parametrize("tokenizer", ["char", pytest.param("gpt2-compact", marks=pytest.mark.gpt2_ranks)])
def test_a_full_disk_publishes_no_partial_shard_and_the_rerun_resumes(
    tokenizer: str, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = DataConfig(source=str(source), tokenizer=tokenizer, shard_tokens=256)
    expected = _stream(prepare(config, tmp_path / "straight"))
    write = ShardWriter.write_tokens
    written: list[int] = []

    def fill_disk_after_three_shards(self, file, tokens) -> None:
        if sum(written) + len(tokens) > 3 * 256 + 100:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(len(tokens))
        write(self, file, tokens)

    with monkeypatch.context() as patch:
        patch.setattr(ShardWriter, "write_tokens", fill_disk_after_three_shards)
        with pytest.raises(WriteError, match=r"/\.partial-.*: no space left .* resume after shard 3$"):
            prepare(config)
    partial = next((tmp_path / "data_cache").glob(".partial-*"))
    assert sorted(p.name for p in partial.glob("*.bin*")) == [f"raw-0000{i}.bin" for i in range(3)]
    assert not list((tmp_path / "data_cache").rglob("meta.json"))

    resumed: list[int] = []
    with monkeypatch.context() as patch:
        patch.setattr(
            ShardWriter, "write_tokens", lambda self, f, t: resumed.append(len(t)) or write(self, f, t)
        )
        prepared = prepare(config)
    assert sum(resumed) == len(expected) - 3 * 256  # the three finished shards were not written again
    assert _stream(prepared).tolist() == expected.tolist()
    assert not partial.exists()


def test_a_deleted_or_truncated_shard_is_named_before_training(source: Path) -> None:
    config = DataConfig(source=str(source), tokenizer="char", shard_tokens=256)
    prepared = prepare(config)
    datamodule = TextDataModule(config, 16)
    with pytest.raises(DataError, match="has not been prepared .*; run prepare"):
        TextDataModule(DataConfig(source=str(source), tokenizer="char"), 16).setup(
            "fit"
        )  # setup never writes
    shard = prepared.directory / "shard-00004.bin"
    os.truncate(shard, 100)
    with pytest.raises(DataError, match=r"^shard .*shard-00004.bin has 100 bytes but meta.json says 512;"):
        datamodule.setup("fit")
    shard.unlink()
    with pytest.raises(DataError, match=r"^shard .*shard-00004.bin is missing; delete"):
        datamodule.prepare_data()


def test_windows_stay_in_one_shard_and_validation_is_a_fixed_spread(source: Path) -> None:
    T = 16
    config = DataConfig(
        source=str(source), tokenizer="char", shard_tokens=256, val_fraction=0.5, val_tokens=160
    )
    datamodule = TextDataModule(config, T)
    datamodule.prepare_data()
    datamodule.setup("fit")
    stream = _stream(datamodule.prepared)
    train = datamodule.train_dataset()
    assert len(train) == sum(len(s) - T for s in datamodule.prepared.segments("train"))
    for index in range(len(train)):  # every window is T + 1 consecutive tokens of one shard
        segment, start = train.locate(index)
        x, y = train[index]
        shard_start = 256 * int(segment.path.stem.split("-")[1])
        begin = shard_start + segment.start + start
        assert (begin + T) // 256 == begin // 256
        assert (
            x.tolist() == stream[begin : begin + T].tolist()
            and y.tolist() == stream[begin + 1 : begin + T + 1].tolist()
        )
    val = datamodule.val_dataloader()
    offsets = list(val.sampler)
    assert len(offsets) == 160 // T
    all_windows = sum((len(s) - 1) // T for s in datamodule.prepared.segments("val"))
    assert (
        all_windows > len(offsets) and offsets[-1] > len(datamodule.val_dataset()) // 2
    )  # spread, not a prefix
    again = TextDataModule(DataConfig(**{**config.__dict__, "batch_size": 3}), T)
    again.setup("fit")
    assert list(again.val_dataloader().sampler) == offsets  # the same windows whatever the batch size
    whole = TextDataModule(DataConfig(**{**config.__dict__, "val_tokens": None}), T)
    whole.setup("fit")
    assert len(list(whole.val_dataloader().sampler)) == all_windows


@pytest.mark.slow
def test_two_processes_preparing_at_once_build_one_folder(source: Path, tmp_path: Path) -> None:
    # Both start preparing at the same moment (each waits, once imported, until the other is
    # ready too), and each shard takes 50 ms, so the two overlap.
    ready = tmp_path / "ready"
    ready.mkdir()
    script = (
        "import logging, os, sys, time; logging.basicConfig(level=logging.INFO, format='%(message)s');"
        "from minigpt.data import DataConfig, prepare; from minigpt.data.shards import ShardWriter;"
        "write = ShardWriter.write_tokens;"
        "ShardWriter.write_tokens = lambda self, f, t: time.sleep(0.05) or write(self, f, t);"
        f"ready = {str(ready)!r}; open(os.path.join(ready, sys.argv[1]), 'w').close();"
        "exec('while len(os.listdir(ready)) < 2: time.sleep(0.01)');"
        f"config = DataConfig(source={str(source)!r}, tokenizer='char', shard_tokens=256);"
        f"p = prepare(config, {str(tmp_path / 'c')!r});"
        "print('DIR', p.directory)"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sum(out.count("prepared local file") for out in outputs) == 1  # one built, the other reused
    dirs = {line for out in outputs for line in out.splitlines() if line.startswith("DIR")}
    assert len(dirs) == 1
    assert [p.name for p in (tmp_path / "c").iterdir() if not p.name.endswith(".lock")] == [
        dirs.pop().split("/")[-1]
    ]


@pytest.mark.slow
def test_an_unreachable_hub_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", WANDB_MODE="disabled")  # nothing listens on port 9
    args = ["--config", "tiny.yaml", "--data.config.source", "nobody/no-such-corpus"]
    args += ["--data.config.streaming", "true", "--trainer.default_root_dir", str(tmp_path / "run")]
    repo = Path(__file__).parents[2]
    result = subprocess.run(
        [sys.executable, str(repo / "train.py"), *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[-1].startswith("error: could not load hub dataset 'nobody/no-such-corpus' (split 'train'):")
    assert "Connection refused" in lines[-1]
    assert not (tmp_path / "run" / "checkpoints").exists()
