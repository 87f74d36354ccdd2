"""Checkpoints, SafeCSVLogger and AutoWandbLogger were named ModelCheckpoint, CSVLogger and
WandbLogger, like the Lightning classes they extend. A run folder written under those names
(class paths in its config.yaml, the checkpoint callback's state in its checkpoints) resumes from
its own config.yaml with the best checkpoint it recorded."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint

from minigpt.cli.train import train_main
from minigpt.cli.train_defaults import CALLBACKS
from minigpt.training.callbacks.checkpoints import Checkpoints

from .conftest import tiny_args
from .helpers import last_checkpoint

CHECKPOINTS_MODULE, LOGGERS_MODULE = "minigpt.training.callbacks.checkpoints", "minigpt.training.loggers"
FORMER_CLASS_PATHS = {
    f"{CHECKPOINTS_MODULE}.Checkpoints": f"{CHECKPOINTS_MODULE}.ModelCheckpoint",
    f"{LOGGERS_MODULE}.SafeCSVLogger": f"{LOGGERS_MODULE}.CSVLogger",
    f"{LOGGERS_MODULE}.AutoWandbLogger": f"{LOGGERS_MODULE}.WandbLogger",
}
"""Each class path now, and the one a run folder's config.yaml held before."""

EVERY_RUNS_KEY = (
    "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 0, "
    "'every_n_epochs': 1, 'train_time_interval': None}"
)
"""The key every run's checkpoint callback has filed its state under in a checkpoint, then and now."""


@pytest.mark.parametrize(
    "settings",
    [
        CALLBACKS[0]["init_args"],  # every run's
        {"save_top_k": 0, "save_last": True},  # rl.yaml's: no monitor
        {"every_n_train_steps": 100, "monitor": "val_loss", "mode": "max"},
    ],
    ids=["every run's", "no monitor", "every 100 steps"],
)
def test_checkpoints_files_its_state_under_the_key_lightnings_model_checkpoint_gives(
    settings: dict, tmp_path: Path
) -> None:
    # Lightning keys a callback's state by its class's name, which for this class was ModelCheckpoint.
    ours = Checkpoints(dirpath=tmp_path, **settings).state_key
    assert ours == LightningModelCheckpoint(dirpath=tmp_path, **settings).state_key
    assert ours.startswith("ModelCheckpoint{")
    if settings is CALLBACKS[0]["init_args"]:
        assert ours == EVERY_RUNS_KEY


@pytest.mark.slow  # two short runs of tiny.yaml
def test_a_run_folder_from_before_the_renames_resumes_from_its_config_with_its_best_checkpoint(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the data cache stays in tmp
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = tmp_path / "run"
    assert train_main(tiny_args(corpus, run, "--trainer.max_steps", "3")) == 0

    # The run's config.yaml as it was written under the former names.
    (config,) = run.glob("csv/version_*/config.yaml")
    text = config.read_text()
    for path, former in FORMER_CLASS_PATHS.items():
        assert f"class_path: {path}\n" in text
        text = text.replace(f"class_path: {path}\n", f"class_path: {former}\n")
        new, old = path.rsplit(".", 1)[1], former.rsplit(".", 1)[1]
        text, count = re.subn(rf"^  {new}:", f"  {old}:", text, flags=re.M)  # under callbacks:, loggers:
        assert count == 1
    older = tmp_path / "older.yaml"
    older.write_text(text)

    # A best score the resumed steps cannot beat: kept only if the resumed run reads the state.
    checkpoint = last_checkpoint(run)
    state = checkpoint["callbacks"][EVERY_RUNS_KEY]
    best = state["best_model_path"]
    assert Path(best) == run / "checkpoints" / "best.ckpt"
    state["best_model_score"] = state["kth_value"] = torch.tensor(0.0)
    state["best_k_models"] = {best: torch.tensor(0.0)}
    torch.save(checkpoint, run / "checkpoints" / "last.ckpt")

    assert train_main(["--config", str(older), "--ckpt_path", "last", "--trainer.max_steps", "6"]) == 0
    resumed = last_checkpoint(run)
    assert resumed["global_step"] == 6
    state = resumed["callbacks"][EVERY_RUNS_KEY]
    assert (state["best_model_path"], float(state["best_model_score"])) == (best, 0.0)
    # Written back under the new names: the same classes, each once.
    (_, again) = sorted(run.glob("csv/version_*/config.yaml"))
    written = again.read_text()
    assert all(written.count(f"class_path: {path}\n") == 1 for path in FORMER_CLASS_PATHS)
    assert not any(f"{former}\n" in written for former in FORMER_CLASS_PATHS.values())
