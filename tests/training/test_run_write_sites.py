"""What a training run writes besides its checkpoints (the prepared data, the CSV log, the samples,
the attention maps, a LoRA run's adapters, the report at the end) meets a full disk and a folder it
may not write with one line naming the file, why and what to do, a non-zero exit, no partial file,
and every earlier file byte for byte as it was. Checkpoints: test_write_faults.py."""

from __future__ import annotations

import errno
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger

from minigpt.cli.train import train_main
from minigpt.common import WriteError
from minigpt.data import CharTokenizer, DataConfig, prepare
from minigpt.model import GPT, GPTConfig
from minigpt.training.callbacks.background import Job
from minigpt.training.callbacks.dashboard import SampleText, _draw_pngs
from minigpt.training.config import LoRAConfig
from minigpt.training.loggers import SafeCSVLogger
from minigpt.training.lora import add_adapters, save_adapter
from minigpt.viz.attention import attention_of

from ..common.faults import FAULTS, DiskFault, assert_says, hashes, run_under
from .conftest import make_play, tiny_args

CHARS = "\n abcdefghijklmnopqrstuvwxyz"
MODEL = GPTConfig(vocab_size=len(CHARS), context_length=16, n_layer=2, n_head=2, n_embd=16)


@pytest.fixture(autouse=True)
def no_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No wandb, and the working directory in tmp."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")


def kept(before: dict[Path, str], after: dict[Path, str]) -> dict[Path, str | None]:
    """The files of `before` as they are now (None: gone)."""
    return {path: after.get(path) for path in before}


@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_the_prepared_data(error: int, why: str, corpus: Path, tmp_path: Path, capsys) -> None:
    cache = tmp_path / "cache"
    other = tmp_path / "other.txt"
    other.write_text(make_play(200, seed=1))
    prepare(DataConfig(source=str(other), tokenizer="char"), cache)  # an earlier preparation
    before = hashes(cache)
    args = tiny_args(corpus, tmp_path / "run", "--data.config.cache_dir", str(cache))
    code, line = run_under(DiskFault(cache, error), train_main, args, capsys)
    assert code == 2
    partial = re.match(
        rf"error: cannot write ({re.escape(str(cache))}/\.partial-play-char-[0-9a-f]+): ", line
    )
    assert partial, line
    assert_says(line, Path(partial[1]), why, error, "--data.config.cache_dir")
    after = hashes(cache)
    assert kept(before, after) == before
    assert [path.name for path in after if path not in before and path.suffix != ".lock"] == []


def logged(logger: LightningCSVLogger) -> None:
    """What a run logs: its settings, then rows, the second with a metric the first lacked."""
    logger.log_hyperparams({"lr": 0.1, "layers": 2})
    logger.log_metrics({"train_loss": 3.0}, step=4)
    logger.save()
    logger.log_metrics({"train_loss": 2.5, "val_loss": 2.7}, step=9)
    logger.save()
    logger.log_metrics({"train_loss": 2.0}, step=14)
    logger.save()


def test_the_csv_log_reads_as_lightnings_own(tmp_path: Path) -> None:
    ours, theirs = (
        SafeCSVLogger(tmp_path / "ours", version=0),
        LightningCSVLogger(tmp_path / "theirs", version=0),
    )
    logged(ours)
    logged(theirs)
    for name in ("metrics.csv", "hparams.yaml"):
        assert (Path(ours.log_dir) / name).read_bytes() == (Path(theirs.log_dir) / name).read_bytes()


@pytest.mark.parametrize(
    "row", [{"train_loss": 2.0}, {"train_loss": 2.0, "val_loss": 2.1}], ids=["appended", "new-column"]
)
@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_the_csv_log(error: int, why: str, row: dict[str, float], tmp_path: Path, monkeypatch) -> None:
    logger = SafeCSVLogger(tmp_path, version=0)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"train_loss": 3.0}, step=4)
    logger.save()
    folder = Path(logger.log_dir)
    before = hashes(folder)
    fault = DiskFault(folder, error, names={"metrics.csv"}).install(monkeypatch)
    logger.log_metrics(row, step=9)
    with pytest.raises(WriteError) as raised:
        logger.save()
    assert str(raised.value).startswith(f"cannot write {folder / 'metrics.csv'}: {why}")
    assert hashes(folder) == before
    hits = len(fault.hits)
    logger.finalize("failed")  # as Lightning does after the error: the rows are not tried again
    assert len(fault.hits) == hits and hashes(folder) == before


@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_the_csv_logs_settings(error: int, why: str, tmp_path: Path, monkeypatch) -> None:
    logger = SafeCSVLogger(tmp_path, version=0)
    logger.log_hyperparams({"lr": 0.1})
    folder = Path(logger.log_dir)
    before = hashes(folder)
    DiskFault(folder, error).install(monkeypatch)
    with pytest.raises(WriteError, match=f"^cannot write {folder / 'hparams.yaml'}: {why}"):
        logger.log_hyperparams({"layers": 2})
    assert hashes(folder) == before


def test_a_csv_log_folder_it_may_not_make(tmp_path: Path, monkeypatch) -> None:
    DiskFault(tmp_path, errno.EACCES).install(monkeypatch)
    logger = SafeCSVLogger(tmp_path / "run", version=0)
    with pytest.raises(WriteError) as raised:
        logger.experiment  # noqa: B018 - made when first asked for
    assert str(raised.value) == (
        f"cannot write {tmp_path / 'run' / 'csv' / 'version_0'}: permission denied at {tmp_path / 'run'}; "
        "make the folder writable"
    )


@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_the_samples(error: int, why: str, tmp_path: Path, monkeypatch) -> None:
    trainer = SimpleNamespace(
        datamodule=SimpleNamespace(tokenizer=CharTokenizer(CHARS)),
        lightning_module=SimpleNamespace(print=lambda text: None),
        default_root_dir=str(tmp_path / "run"),
        loggers=[],
    )
    sampler = SampleText()
    sampler.show(trainer, 5, [[3, 4, 5]])
    before = hashes(tmp_path / "run")
    DiskFault(tmp_path / "run", error).install(monkeypatch)
    with pytest.raises(WriteError, match=f"^cannot write {tmp_path / 'run' / 'samples.jsonl'}: {why}"):
        sampler.show(trainer, 10, [[6, 7, 8]])
    assert hashes(tmp_path / "run") == before


@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_the_attention_maps_drawn_beside_training(error: int, why: str, tmp_path: Path, monkeypatch) -> None:
    torch.manual_seed(0)
    weights, labels = attention_of(GPT(MODEL).eval(), CharTokenizer(CHARS), "to be or not")
    folder = tmp_path / "attention"
    folder.mkdir()
    assert Job(_draw_pngs, weights, labels, "to be", folder, background=False).result()
    before = hashes(folder)
    DiskFault(folder, error).install(monkeypatch)
    job = Job(_draw_pngs, weights, labels, "to be", folder, background=True)  # in a forked child
    with pytest.raises(WriteError, match=f"^cannot write {folder / 'layer0.png'}: {why}"):
        job.result()
    assert hashes(folder) == before


@pytest.mark.parametrize("name", ["adapter_model.safetensors", "adapter_config.json"])
@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_a_lora_runs_adapters(error: int, why: str, name: str, tmp_path: Path, monkeypatch) -> None:
    model = GPT(MODEL)
    add_adapters(model, LoRAConfig(rank=2))
    folder = tmp_path / "adapter"
    save_adapter(model, model.state_dict(), folder, base="base.safetensors")
    before = hashes(folder)
    fault = DiskFault(folder, error, names={name}).install(monkeypatch)
    with pytest.raises(WriteError, match=f"^cannot write {folder / name}: {why}"):
        save_adapter(model, model.state_dict(), folder, base="base.safetensors")
    assert fault.hits
    assert hashes(folder) == before


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "written"),
    [("metrics.csv", "csv/version_0/metrics.csv"), ("report.html", "checkpoints/last.ckpt")],
)
@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_a_run(error: int, why: str, name: str, written: str, corpus: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    # metrics.csv: its second write, after the first; report.html: at the end, after the checkpoints.
    fault = DiskFault(run, error, names={name}, skip=int(name == "metrics.csv"))
    code, line = run_under(fault, train_main, tiny_args(corpus, run, "--trainer.max_steps", "4"), capsys)
    # Once a checkpoint is written, the line says how to resume from it, as a failed save's does.
    checkpointed = name == "report.html"
    assert code == (1 if checkpointed else 2)
    assert ("--ckpt_path last" in line) == checkpointed, line
    assert fault.before is not None
    assert_says(line, fault.hits[0].parent / name, why, error)
    assert hashes(run) == fault.before
    assert run / written in fault.before
