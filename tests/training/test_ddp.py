"""Two-process DDP (gloo) and FSDP runs on the CPU: the same optimisation as one process, exact
resume, checkpoints and logs from rank 0 alone, the wandb dashboard offline, and every rank stopped
together by a signal or a divergence.

The runs are conftest.py's session fixtures, each launched once for the checks of this file:
`two_processes` and `one_process` train SAME_RUN (the first on two processes, wandb offline without
credentials; the second on one, logged in to an unreachable wandb, with a logger added by YAML);
`with_dropout`, `stopped_with_dropout` (SIGTERM to one rank) and `resumed_with_dropout` train
WITH_DROPOUT (a two-process run shorter than its log and validation intervals); `fsdp_and_diverged`
trains SAME_RUN under FSDP and a run whose rank 1 diverges. tokens_per_step fixes the global batch,
and DDP splits it over the ranks."""

from __future__ import annotations

import json
import math
import signal
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from wandb.proto.wandb_internal_pb2 import Record

from minigpt.checkpoints import MODEL_KEY, load_model
from minigpt.data import DataConfig, prepare
from minigpt.data.windows import train_offsets

from .conftest import WANDB_SECRET, Launch
from .helpers import read_metrics

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5
"""Relative, for the two layouts' losses and weights: the same sums, added in another order
(a mean of two ranks' means against one mean of two micro-batches), differ by float32 rounding,
about 1e-7 here."""

WEIGHT_TOLERANCE = 1e-5
"""Absolute, for the weights after 8 steps (they are about 0.02 to 0.1): Adam divides each update by
the root of its running squared gradient, which magnifies those rounding differences where a
gradient is near zero; the largest measured was 2.5e-6, a thousandth of one step at lr 3e-3."""


def step_losses(records: Path) -> list[float]:
    return json.loads((records / "steps.json").read_text())


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def test_two_processes_follow_the_loss_curve_of_one(two_processes: Launch, one_process: Launch) -> None:
    assert (
        "global batch 1,024 tokens (micro-batch 8 windows x 64 tokens x 2 accumulated x 1 process)"
        in one_process.result.stderr
    )
    one, two = step_losses(one_process.records), step_losses(two_processes.records)
    assert len(one) == len(two) == 8
    assert two == pytest.approx(one, rel=TOLERANCE)
    assert one[-1] < one[0] - 0.4  # it learned: the curves are not flat by accident
    val = [
        [float(r["val_loss"]) for r in read_metrics(launched.run) if r.get("val_loss")]
        for launched in (one_process, two_processes)
    ]
    assert len(val[0]) == 2 and val[1] == pytest.approx(val[0], rel=TOLERANCE)
    # Bits per byte from the same sums over both ranks: ASCII characters, one byte each, no end-of-text.
    bpb = [
        [float(r["val_bpb"]) for r in read_metrics(launched.run) if r.get("val_bpb")]
        for launched in (one_process, two_processes)
    ]
    assert bpb[1] == pytest.approx(bpb[0], rel=TOLERANCE)
    assert bpb[0] == pytest.approx([v / math.log(2) for v in val[0]], rel=TOLERANCE)
    a, b = weights(one_process.run), weights(two_processes.run)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=TOLERANCE, atol=WEIGHT_TOLERANCE)


def test_two_processes_write_each_checkpoint_once_from_rank_0(two_processes: Launch) -> None:
    records = two_processes.records
    assert sorted(p.name for p in records.glob("saves-rank*.txt")) == ["saves-rank0.txt"]
    # Two validations, each saving the best and the last checkpoint, each once.
    saves = (records / "saves-rank0.txt").read_text().split()
    assert sorted(saves) == ["best.ckpt", "best.ckpt", "last.ckpt", "last.ckpt"]
    assert sorted(p.name for p in (two_processes.run / "checkpoints").iterdir()) == [
        "best.ckpt",
        "last.ckpt",
    ]
    assert len(list((two_processes.run / "csv").glob("version_*"))) == 1


def test_a_stopped_two_process_run_resumes_to_the_same_weights(
    with_dropout: Launch, stopped_with_dropout: Launch, resumed_with_dropout: Launch
) -> None:
    straight, stopped, resumed = with_dropout, stopped_with_dropout, resumed_with_dropout
    assert straight.result.returncode == 0, straight.result.stderr[-3000:]
    description = torch.load(straight.run / "checkpoints" / "last.ckpt", weights_only=True)[MODEL_KEY]
    assert description["gpt"]["dropout"] == 0.1
    # SIGTERM to rank 1 as the second step starts: both ranks finish it, save it and stop.
    assert stopped.result.returncode == 128 + signal.SIGTERM, stopped.result.stderr[-3000:]
    assert torch.load(stopped.run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2
    assert resumed.result.returncode == 0, resumed.result.stderr[-3000:]
    # Exactly: the same windows, the same dropout masks, the same reductions in the same order;
    # the optimizer's state, the data position and the random generator restored from the checkpoint.
    losses = step_losses(straight.records)
    assert len(losses) == 4
    assert step_losses(stopped.records) == losses[:2]
    assert step_losses(resumed.records) == losses[2:]
    after_resume = weights(resumed.run)
    for key, value in weights(straight.run).items():
        torch.testing.assert_close(after_resume[key], value, rtol=0, atol=0, msg=key)


def test_fsdp_on_two_cpu_processes_follows_ddp_and_writes_readable_shards(
    two_processes: Launch, fsdp_and_diverged: tuple[Launch, Launch]
) -> None:
    # Lightning's FSDPStrategy with gpt2-medium.yaml's settings, on CPU processes (FSDP_STRATEGY).
    # Weight decay stays on (tiny.yaml's 0.1): the optimizer picks the decayed parameters by their
    # module, so FSDP's flat 1-D shards are decayed as DDP's matrices are.
    sharded = fsdp_and_diverged[0]
    assert sharded.result.returncode == 0, sharded.result.stderr[-3000:]
    # Gradients clipped by their global norm (clipping is at work in these steps), as under DDP.
    assert step_losses(sharded.records) == pytest.approx(step_losses(two_processes.records), rel=TOLERANCE)
    assert sharded.result.stdout.count("--- sample at step 8 ---") == 1  # drawn from the gathered weights
    for name in ("best.ckpt", "last.ckpt"):  # one folder each, one shard per process
        assert sorted(p.name for p in (sharded.run / "checkpoints" / name).glob("*.distcp")) == [
            "__0_0.distcp",
            "__1_0.distcp",
        ]
    # One process reads the shards back: generate.py and export.py take the folder as they take a file.
    model, _ = load_model(sharded.run / "checkpoints" / "last.ckpt")
    ddp = weights(two_processes.run)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, ddp[f"model.{key}"], rtol=TOLERANCE, atol=WEIGHT_TOLERANCE)


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


def test_wandb_runs_offline_without_credentials(two_processes: Launch) -> None:
    # Under DDP, from rank 0 alone.
    runs = list((two_processes.run / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "expected one offline wandb run folder under the run's output directory"
    metrics = {"train_loss", "val_loss", "val_ppl", "tokens_per_sec", "tokens_seen", "grad_norm"}
    metrics |= {"lr-AdamW/decay", "lr-AdamW/no_decay"}  # the groups by name
    config, rows = wandb_logs(runs[0], metrics)
    assert config["model"]["gpt"]["n_layer"] == 2 and config["trainer"]["max_steps"] == 8
    # Every metric is in the history as logged to the CSV file: the same values at the same steps.
    csv_rows = read_metrics(two_processes.run)
    for metric in sorted(metrics):
        logged = {row["trainer/global_step"]: row[metric] for row in rows if metric in row}
        expected = {int(row["step"]): float(row[metric]) for row in csv_rows if row.get(metric)}
        assert len(expected) >= 2 and logged == pytest.approx(expected, rel=1e-7), metric
    images = {p.name.split("_")[0] for p in runs[0].glob("files/media/images/*.png")}
    assert images == {"attention", "loss"}, images  # attention maps each validation, curves at the end
    assert (two_processes.run / "report.html").is_file()
    tables = [json.loads(p.read_text()) for p in runs[0].glob("files/media/table/samples_*.table.json")]
    assert len(tables) == 2, "one samples table per validation"
    table = max(tables, key=lambda t: len(t["data"]))
    assert table["columns"] == ["step", "text"]
    assert [row[0] for row in table["data"]] == [4, 8]
    assert (two_processes.run / "csv").is_dir()  # CSV always runs beside wandb


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


def test_two_process_ddp_on_cpu(two_processes: Launch, corpus: Path, tmp_path: Path) -> None:
    # One process wrote checkpoints and logs.
    assert len(list((two_processes.run / "csv").glob("version_*"))) == 1
    assert two_processes.result.stdout.count("--- sample at step 8 ---") == 1
    checkpoint = torch.load(two_processes.run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 8
    rows = read_metrics(two_processes.run)
    val = [float(r["val_loss"]) for r in rows if r.get("val_loss")]
    assert len(val) == 2 and val[-1] < val[0]

    first, second = read_ranks(two_processes.records)
    # Each rank reads its own windows: in one step the two ranks read, between them, exactly the
    # windows one process reads in two (the epoch's random start positions, dealt out in turn).
    # A step is 16 windows of 64 tokens (SAME_RUN): 8 on each rank.
    prepared = prepare(
        DataConfig(source=str(corpus), tokenizer="char", cache_dir=str(tmp_path / "data_cache"))
    )
    train = prepared.tokens("train")
    offsets = train_offsets(len(train), 64, seed=1337, epoch=0)
    for step in range(2):
        mine, theirs = first["windows"][step], second["windows"][step]
        expected = [train[o : o + 16].tolist() for o in offsets[16 * step : 16 * (step + 1)]]
        assert len(mine) == len(theirs) == 8
        assert sorted(mine + theirs) == sorted(expected)
        assert not {tuple(w) for w in mine} & {tuple(w) for w in theirs}
    # The logged validation loss is the mean over both ranks, whose windows and losses differ.
    for logged, mine, theirs in zip(val, first["val_loss"], second["val_loss"], strict=True):
        assert abs(mine - theirs) > 1e-3
        assert logged == pytest.approx((mine + theirs) / 2, abs=1e-5)


def test_a_two_process_run_shorter_than_its_log_interval_ends_with_a_checkpoint_and_a_report(
    with_dropout: Launch,
) -> None:
    # tiny.yaml logs every 5 steps and validates every 20: 4 steps are shorter than both, and the
    # run validates once at its end all the same (ValidateAtEnd), every rank taking part.
    result = with_dropout.result
    assert result.returncode == 0, result.stderr[-3000:]
    assert torch.load(with_dropout.run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    assert (with_dropout.run / "checkpoints" / "best.ckpt").is_file()
    assert (with_dropout.run / "loss_curves.png").is_file()
    report = (with_dropout.run / "report.html").read_text(encoding="utf-8")
    assert "at step 4" in report  # the final validation loss
    assert "error" not in result.stderr.lower(), result.stderr[-3000:]


def test_sigterm_to_one_rank_saves_and_stops_every_rank(stopped_with_dropout: Launch) -> None:
    result = stopped_with_dropout.result
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    assert "stopped by SIGTERM: saved step 2" in result.stderr
    checkpoint = stopped_with_dropout.run / "checkpoints" / "last.ckpt"
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 2
    for record in read_ranks(stopped_with_dropout.records):
        assert_gone(record["pid"])


def test_divergence_on_one_rank_stops_every_rank(fsdp_and_diverged: tuple[Launch, Launch]) -> None:
    diverged = fsdp_and_diverged[1]  # rank 1's weights poisoned at step 3
    result = diverged.result
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: training diverged: the loss became nan on rank 1 at step 3; no checkpoint was written"
    ]
    for record in read_ranks(diverged.records):
        assert_gone(record["pid"])


def test_the_wandb_api_key_never_reaches_logs_or_saved_configs(one_process: Launch) -> None:
    assert list((one_process.run / "wandb").glob("offline-run-*"))
    assert WANDB_SECRET not in one_process.result.stdout + one_process.result.stderr
    for path in one_process.folder.rglob("*"):  # the run folder and the added logger's
        if path.is_file():
            assert WANDB_SECRET.encode() not in path.read_bytes(), path


def test_a_logger_is_added_by_yaml_alone(one_process: Launch) -> None:
    for folder in (one_process.run / "csv", one_process.folder / "elsewhere" / "extra"):
        rows = (folder / "version_0" / "metrics.csv").read_text().splitlines()
        assert "train_loss" in rows[0] and len(rows) > 1, folder
