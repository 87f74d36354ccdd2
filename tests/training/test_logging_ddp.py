"""The wandb dashboard offline, and a two-process DDP run on the CPU."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch

from .conftest import run_script, tiny_args
from .test_train_generate import read_metrics

pytestmark = pytest.mark.slow


def test_wandb_runs_offline_without_credentials(corpus: Path, tmp_path: Path) -> None:
    env = {"WANDB_MODE": None, "WANDB_API_KEY": None, "NETRC": str(tmp_path / "no-netrc")}
    result = run_script(
        "train.py",
        *tiny_args(corpus, tmp_path / "run", "--trainer.logger.mode", "auto"),
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "expected one offline wandb run folder under the run's output directory"
    record = next(runs[0].glob("run-*.wandb")).read_bytes()
    for key in (
        b"n_layer",
        b"train_loss",
        b"val_loss",
        b"tokens_per_sec",
        b"lr-AdamW",
        b"tokens_seen",
        b"grad_norm",
    ):
        assert key in record, key  # config and metrics went to the dashboard
    images = {p.name.split("_")[0] for p in runs[0].glob("files/media/images/*.png")}
    assert images == {"attention", "loss"}, images  # attention maps each validation, curves at the end
    assert (tmp_path / "run" / "report.html").is_file()
    tables = [json.loads(p.read_text()) for p in runs[0].glob("files/media/table/samples_*.table.json")]
    assert len(tables) == 2, "one samples table per validation"
    table = max(tables, key=lambda t: len(t["data"]))
    assert table["columns"] == ["step", "text"]
    assert [row[0] for row in table["data"]] == [20, 40]
    assert (tmp_path / "run" / "csv").is_dir()  # CSV always runs beside wandb


def test_two_process_ddp_on_cpu(corpus: Path, tmp_path: Path) -> None:
    args = tiny_args(
        corpus,
        tmp_path / "run",
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "2",
        "--trainer.strategy",
        "ddp",
        "--trainer.max_steps",
        "20",
        "--trainer.val_check_interval",
        "10",
    )
    result = run_script("train.py", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # One process wrote checkpoints and logs.
    assert len(list((tmp_path / "run" / "csv").glob("version_*"))) == 1
    assert result.stdout.count("--- sample at step 20 ---") == 1
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 20
    rows = read_metrics(tmp_path / "run")
    val = [float(r["val_loss"]) for r in rows if r.get("val_loss")]
    assert len(val) == 2 and val[-1] < val[0]


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
        result = run_script(
            "train.py", *tiny_args(corpus, tmp_path / "run"), cwd=tmp_path, env=env, timeout=120
        )
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
