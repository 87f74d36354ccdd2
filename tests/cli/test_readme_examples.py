"""README's examples of adding a callback to train.py, run as written on tiny.yaml."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason

from minigpt.cli.train import train_main

from ..training.conftest import REPO, make_play, tiny_args
from ..training.test_train_generate import read_metrics

pytestmark = pytest.mark.slow  # seconds of training each, and train.py runs ldconfig to find libc

README = (REPO / "README.md").read_text()

FROZEN = ("--model.optim.lr", "1e-30", "--model.optim.min_lr", "0", "--trainer.val_check_interval", "1")
"""Updates of 1e-30 leave every weight as it is, so no validation loss improves on the first one;
a validation after every step."""

SMALL = ("--model.gpt.n_layer", "1", "--model.gpt.n_head", "1", "--trainer.limit_val_batches", "1")
"""One layer of one head, one validation batch: the attention maps drawn at every validation are
most of such a run's time."""


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    path = tmp_path / "play.txt"
    path.write_text(make_play(300))
    return path


def readme_yaml_with(text: str) -> dict:
    """The README's YAML example that contains `text`."""
    (block,) = [block for block in re.findall(r"```yaml\n(.*?)```", README, re.S) if text in block]
    return yaml.safe_load(block)


def yaml_example(tmp_path: Path) -> list[str]:
    """README's YAML example after tiny.yaml's own callbacks (a YAML list replaces the whole list),
    its second CSV log in tmp_path instead of /shared/logs."""
    example = readme_yaml_with("EarlyStopping")
    tiny = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    example["trainer"]["callbacks"] = tiny["trainer"]["callbacks"] + example["trainer"]["callbacks"]
    (shared,) = [entry for entry in example["trainer"]["logger"] if "init_args" in entry]
    assert shared["init_args"]["save_dir"] == "/shared/logs"
    shared["init_args"]["save_dir"] = str(tmp_path / "shared" / "logs")
    path = tmp_path / "early.yaml"
    path.write_text(yaml.safe_dump(example))
    return ["--config", str(path)]


def command_line_example() -> list[str]:
    """README's options that append early stopping on the command line."""
    (options,) = re.findall(r"`(--trainer\.callbacks\+=EarlyStopping [^`]*)`", README)
    return options.split()


@pytest.mark.parametrize("form", ["yaml", "command line"])
def test_early_stopping_as_the_readme_adds_it_stops_when_val_loss_stops_improving(
    corpus: Path, tmp_path: Path, form: str
) -> None:
    added = yaml_example(tmp_path) if form == "yaml" else command_line_example()
    run = tmp_path / "run"
    assert train_main(tiny_args(corpus, run, *added, *FROZEN, *SMALL)) == 0

    # The first validation set the best loss; three more without improvement (patience 3) stopped
    # the run at step 4 of tiny.yaml's 40.
    val_losses = [float(row["val_loss"]) for row in read_metrics(run) if row.get("val_loss")]
    assert len(val_losses) == 4 and len(set(val_losses)) == 1, val_losses
    (config,) = run.glob("csv/version_*/config.yaml")
    assert yaml.safe_load(config.read_text())["trainer"]["max_steps"] == 40
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 4
    stopper = checkpoint["callbacks"][EarlyStopping(monitor="val_loss").state_key]
    assert (stopper["patience"], stopper["wait_count"]) == (3, 3)
    assert stopper["stopping_reason"] == EarlyStoppingReason.PATIENCE_EXHAUSTED.value
    if form == "yaml":  # the example's second CSV log has the same curve
        (shared,) = (tmp_path / "shared" / "logs" / "small").glob("version_*/metrics.csv")
        with shared.open() as f:
            assert [float(row["val_loss"]) for row in csv.DictReader(f) if row["val_loss"]] == val_losses
