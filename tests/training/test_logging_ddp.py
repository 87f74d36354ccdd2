"""The wandb dashboard offline, and a two-process DDP run on the CPU."""

from __future__ import annotations

import json
import signal
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from wandb.proto.wandb_internal_pb2 import Record

from minigpt.data import DataConfig, prepare
from minigpt.data.windows import train_offsets

from .conftest import REPO, run_script, tiny_args
from .test_faults import FAULTS
from .test_train_generate import read_metrics

pytestmark = pytest.mark.slow


WANDB_LOG_HEADER = b":W&B\xe1\xbe\x00"
"""An offline run's `.wandb` file starts with wandb's name, magic number 0xBEE1 and version 0."""

WANDB_BLOCK = 32 * 1024
"""Then come protobuf `Record`s in LevelDB's log layout: 32 KiB blocks of chunks, each after a
7-byte header (CRC32, length, type: 1 a whole record, 2-4 its first, middle and last part); a
block's tail too short for a header is padding."""


def wandb_records(path: Path) -> list[Record]:
    """The records written so far (wandb's Python package has no reader for these files)."""
    data = path.read_bytes()
    assert data.startswith(WANDB_LOG_HEADER), path
    records, pending, at = [], b"", len(WANDB_LOG_HEADER)
    while at + 7 <= len(data):
        if WANDB_BLOCK - at % WANDB_BLOCK < 7:
            at += WANDB_BLOCK - at % WANDB_BLOCK
            continue
        length, kind = struct.unpack_from("<HB", data, at + 4)
        if at + 7 + length > len(data):
            break  # still being written
        pending += data[at + 7 : at + 7 + length]
        at += 7 + length
        if kind in (1, 4):
            records.append(Record.FromString(pending))
            pending = b""
    return records


def wandb_logs(run: Path, metrics: set[str], within: float = 30.0) -> tuple[dict[str, Any], list[dict]]:
    """The offline run's config and its history rows (one dict of metrics per `log` call) once
    the rows hold every metric of `metrics`, or as they are after `within` seconds: wandb's service
    process writes them, and may still be writing when train.py has exited."""
    deadline = time.monotonic() + within
    while True:
        config, rows = {}, []
        for record in wandb_records(next(run.glob("run-*.wandb"))):
            kind = record.WhichOneof("record_type")
            items = record.config.update if kind == "config" else record.history.item
            entries = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}
            if kind == "config":
                config |= entries
            elif kind == "history":
                rows.append(entries)
        if metrics <= {key for row in rows for key in row} or time.monotonic() > deadline:
            return config, rows
        time.sleep(0.5)


def test_wandb_runs_offline_without_credentials(corpus: Path, tmp_path: Path) -> None:
    env = {"WANDB_MODE": None, "WANDB_API_KEY": None, "NETRC": str(tmp_path / "no-netrc")}
    result = run_script(
        "train.py",
        *tiny_args(
            corpus,
            tmp_path / "run",
            *(
                "--trainer.logger.mode",
                "auto",
                "--trainer.max_steps",
                "10",
                "--trainer.val_check_interval",
                "5",
            ),
        ),
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "expected one offline wandb run folder under the run's output directory"
    metrics = {"train_loss", "val_loss", "val_ppl", "tokens_per_sec", "tokens_seen", "grad_norm"}
    metrics |= {"lr-AdamW/pg1", "lr-AdamW/pg2"}
    config, rows = wandb_logs(runs[0], metrics)
    assert config["model"]["gpt"]["n_layer"] == 2 and config["trainer"]["max_steps"] == 10
    # Every metric is in the history as logged to the CSV file: the same values at the same steps.
    csv_rows = read_metrics(tmp_path / "run")
    for metric in sorted(metrics):
        logged = {row["trainer/global_step"]: row[metric] for row in rows if metric in row}
        expected = {int(row["step"]): float(row[metric]) for row in csv_rows if row.get(metric)}
        assert len(expected) >= 2 and logged == pytest.approx(expected, rel=1e-7), metric
    images = {p.name.split("_")[0] for p in runs[0].glob("files/media/images/*.png")}
    assert images == {"attention", "loss"}, images  # attention maps each validation, curves at the end
    assert (tmp_path / "run" / "report.html").is_file()
    tables = [json.loads(p.read_text()) for p in runs[0].glob("files/media/table/samples_*.table.json")]
    assert len(tables) == 2, "one samples table per validation"
    table = max(tables, key=lambda t: len(t["data"]))
    assert table["columns"] == ["step", "text"]
    assert [row[0] for row in table["data"]] == [5, 10]
    assert (tmp_path / "run" / "csv").is_dir()  # CSV always runs beside wandb


DDP = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
ENV = {"PYTHONPATH": str(REPO)}


def ddp_args(corpus: Path, run: Path, ranks: Path, *extra: str) -> list[str]:
    """tiny.yaml on two CPU processes, each recording what it saw into `ranks`."""
    probe = ["--trainer.callbacks+=tests.training.probes.RecordRank", f"--trainer.callbacks.folder={ranks}"]
    return tiny_args(corpus, run, *DDP, *probe, *extra)


def read_ranks(ranks: Path) -> list[dict]:
    return [json.loads((ranks / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def assert_gone(pid: int, within: float = 10.0) -> None:
    """The process has exited (a zombie waiting for its parent counts as gone)."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + within
    while stat.exists() and time.monotonic() < deadline:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.2)
    assert not stat.exists(), f"process {pid} is still running"


def test_two_process_ddp_on_cpu(corpus: Path, tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    args = ddp_args(
        corpus, tmp_path / "run", ranks, "--trainer.max_steps", "10", "--trainer.val_check_interval", "5"
    )
    result = run_script("train.py", *args, cwd=tmp_path, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    # One process wrote checkpoints and logs.
    assert len(list((tmp_path / "run" / "csv").glob("version_*"))) == 1
    assert result.stdout.count("--- sample at step 10 ---") == 1
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 10
    rows = read_metrics(tmp_path / "run")
    val = [float(r["val_loss"]) for r in rows if r.get("val_loss")]
    assert len(val) == 2 and val[-1] < val[0]

    first, second = read_ranks(ranks)
    # Each rank reads its own windows: in one step the two ranks read, between them, exactly the
    # windows one process reads in two (the epoch's random start positions, dealt out in turn).
    prepared = prepare(
        DataConfig(source=str(corpus), tokenizer="char", cache_dir=str(tmp_path / "data_cache"))
    )
    train = prepared.tokens("train")
    offsets = train_offsets(len(train), 64, seed=1337, epoch=0)
    for step in range(2):
        mine, theirs = first["windows"][step], second["windows"][step]
        expected = [train[o : o + 16].tolist() for o in offsets[32 * step : 32 * (step + 1)]]
        assert len(mine) == len(theirs) == 16
        assert sorted(mine + theirs) == sorted(expected)
        assert not {tuple(w) for w in mine} & {tuple(w) for w in theirs}
    # The logged validation loss is the mean over both ranks, whose windows and losses differ.
    for logged, mine, theirs in zip(val, first["val_loss"], second["val_loss"], strict=True):
        assert abs(mine - theirs) > 1e-3
        assert logged == pytest.approx((mine + theirs) / 2, abs=1e-5)


def run_with_fault_on_rank_1(corpus: Path, tmp_path: Path, ranks: Path, fault: str, *init_args: str):
    """A 2-process run into tmp_path/run with `fault` (from faults.py) striking rank 1 at step 3;
    it must end without a traceback."""
    args = [f"--trainer.callbacks+={FAULTS}.{fault}", "--trainer.callbacks.step=3"]
    args += [f"--trainer.callbacks.{arg}" for arg in init_args] + ["--trainer.callbacks.rank=1"]
    result = run_script(
        "train.py", *ddp_args(corpus, tmp_path / "run", ranks, *args), cwd=tmp_path, env=ENV, timeout=180
    )
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result


def test_sigterm_to_one_rank_saves_and_stops_every_rank(corpus: Path, tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    result = run_with_fault_on_rank_1(corpus, tmp_path, ranks, "SignalAt", f"signum={int(signal.SIGTERM)}")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    assert "stopped by SIGTERM: saved step 4" in result.stderr
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    for record in read_ranks(ranks):
        assert_gone(record["pid"])


def test_divergence_on_one_rank_stops_every_rank(corpus: Path, tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    result = run_with_fault_on_rank_1(corpus, tmp_path, ranks, "PoisonWeights")
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: training diverged: the loss became nan on rank 1 at step 3; no checkpoint was written"
    ]
    for record in read_ranks(ranks):
        assert_gone(record["pid"])


def test_the_wandb_api_key_never_reaches_logs_or_saved_configs(corpus: Path, tmp_path: Path) -> None:
    secret = "sentinel" + "0123456789abcdef" * 2 + "sentinel"
    # Logged in, and the server refuses connections (a port bound but not listening), whatever
    # this machine's network: the run must fall back to offline logging without hanging.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        server = f"http://127.0.0.1:{closed.getsockname()[1]}"
        env = {
            "WANDB_MODE": None,
            "WANDB_API_KEY": secret,
            "WANDB_BASE_URL": server,
            "NETRC": str(tmp_path / "no-netrc"),
        }
        args = tiny_args(
            corpus, tmp_path / "run", "--trainer.max_steps", "10", "--trainer.val_check_interval", "5"
        )
        result = run_script("train.py", *args, cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert secret not in result.stdout + result.stderr
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_a_logger_is_added_by_yaml_alone(corpus: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        "trainer:\n"
        "  logger:\n"
        "    - class_path: minigpt.training.loggers.CSVLogger\n"
        "    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        f"      init_args: {{save_dir: {tmp_path / 'elsewhere'}, name: extra}}\n"
    )
    args = tiny_args(corpus, tmp_path / "run", "--config", str(extra), "--trainer.max_steps", "10")
    result = run_script("train.py", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for folder in (tmp_path / "run" / "csv", tmp_path / "elsewhere" / "extra"):
        rows = (folder / "version_0" / "metrics.csv").read_text().splitlines()
        assert "train_loss" in rows[0] and len(rows) > 1, folder
