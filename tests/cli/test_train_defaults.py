"""Every run's loggers and callbacks are the parser's defaults; a config changes them by name, and
configs laid over each other merge name by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from minigpt.cli.train import train_main
from minigpt.cli.train_defaults import (
    CALLBACK_ORDER,
    CALLBACKS,
    FORMER_CLASS_PATHS,
    FORMER_NAMES,
    KNOWN,
    LOGGERS,
    by_name,
    class_name,
    expanded,
)

REPO = Path(__file__).resolve().parents[2]


def printed(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        train_main([*args, "--print_config"])
    assert exit_info.value.code == 0
    return yaml.safe_load(capsys.readouterr().out)


def names(entries: list[dict]) -> list[str]:
    return [class_name(entry) for entry in entries]


def test_a_callback_added_by_name_takes_its_place_in_the_order() -> None:
    out = by_name(CALLBACKS, {"EMAWeights": {"decay": 0.9}}, CALLBACK_ORDER)
    order = names(out)
    assert order.index("AttentionMaps") < order.index("EMAWeights") < order.index("ValidateAtEnd")
    assert out[order.index("EMAWeights")] == {"class_path": KNOWN["EMAWeights"], "init_args": {"decay": 0.9}}
    assert names(CALLBACKS) == [name for name in order if name != "EMAWeights"]  # the defaults untouched


def test_settings_by_name_merge_into_the_entry_and_false_removes_it() -> None:
    changes = {"Checkpoints": {"save_top_k": 3}, "AttentionMaps": False, "SampleText": None}
    out = by_name(CALLBACKS, changes, CALLBACK_ORDER)
    (checkpoint,) = [entry for entry in out if class_name(entry) == "Checkpoints"]
    assert checkpoint["init_args"]["save_top_k"] == 3
    assert checkpoint["init_args"]["monitor"] == "val_loss"  # the rest of its settings stay
    assert names(out) == [name for name in names(CALLBACKS) if name != "AttentionMaps"]


def test_a_former_name_changes_the_class_of_the_new_name() -> None:
    assert FORMER_NAMES == {
        "ModelCheckpoint": "Checkpoints",
        "CSVLogger": "SafeCSVLogger",
        "WandbLogger": "AutoWandbLogger",
    }
    former = by_name(CALLBACKS, {"ModelCheckpoint": {"save_top_k": 3}}, CALLBACK_ORDER)
    assert former == by_name(CALLBACKS, {"Checkpoints": {"save_top_k": 3}}, CALLBACK_ORDER)
    assert names(by_name(LOGGERS, {"WandbLogger": False}, [])) == ["SafeCSVLogger"]
    # Given both, the former name's change comes last, as its field does.
    both = {"AutoWandbLogger": {"tags": ["a"], "group": "g"}, "WandbLogger": {"tags": ["b"]}}
    (_, wandb) = by_name(LOGGERS, both, [])
    assert (wandb["init_args"]["tags"], wandb["init_args"]["group"]) == (["b"], "g")
    removed_after = {"AutoWandbLogger": {"tags": ["a"]}, "WandbLogger": False}
    assert names(by_name(LOGGERS, removed_after, [])) == ["SafeCSVLogger"]
    # Lightning's own CSVLogger in the list is another class: the former name leaves it be.
    theirs = {"class_path": "lightning.pytorch.loggers.CSVLogger"}
    assert by_name([*LOGGERS, theirs], {"CSVLogger": False}, [])[1:] == [theirs]


def test_a_former_name_in_a_users_config_or_on_the_command_line_means_the_same_class(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    settings = "callbacks:\n  {}: {{save_top_k: 2}}\nloggers:\n  {}: {{tags: [mine]}}\n"
    former, new = tmp_path / "former.yaml", tmp_path / "new.yaml"
    former.write_text(settings.format("ModelCheckpoint", "WandbLogger"))
    new.write_text(settings.format("Checkpoints", "AutoWandbLogger"))
    by_former = printed(capsys, "--config", "tiny.yaml", "--config", str(former))
    assert by_former == printed(capsys, "--config", "tiny.yaml", "--config", str(new))
    trainer = by_former["trainer"]
    assert trainer["callbacks"][0]["init_args"]["save_top_k"] == 2
    assert trainer["logger"][1]["init_args"]["tags"] == ["mine"]
    # --print_config and the run's config.yaml say the new names only.
    assert not FORMER_NAMES.keys() & {*by_former["callbacks"], *by_former["loggers"]}
    assert by_former["callbacks"]["Checkpoints"] == {"save_top_k": 2}

    def switched(checkpoint: str, wandb: str, csv: str) -> dict:
        off = (f"--callbacks.{checkpoint}", "false", f"--loggers.{wandb}", "false")
        return printed(capsys, "--config", "tiny.yaml", *off, f"--loggers.{csv}", "{name: mine}")

    by_former = switched("ModelCheckpoint", "WandbLogger", "CSVLogger")
    assert by_former == switched("Checkpoints", "AutoWandbLogger", "SafeCSVLogger")
    assert "Checkpoints" not in names(by_former["trainer"]["callbacks"])
    (csv,) = by_former["trainer"]["logger"]
    assert (class_name(csv), csv["init_args"]["name"]) == ("SafeCSVLogger", "mine")


def test_a_run_folders_config_from_before_the_renames_prints_as_the_same_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    now = printed(capsys, "--config", "small.yaml")
    text = yaml.safe_dump(now)
    for former, path in FORMER_CLASS_PATHS.items():
        text = text.replace(f"class_path: {path}\n", f"class_path: {former}\n")
    for former, name in FORMER_NAMES.items():
        text = text.replace(f"  {name}:", f"  {former}:")
    assert "minigpt.training.loggers.WandbLogger" in text and "  ModelCheckpoint: null" in text
    older = tmp_path / "config.yaml"
    older.write_text(text)
    assert printed(capsys, "--config", str(older)) == now


def test_small_yaml_prints_the_callbacks_and_loggers_it_listed_in_full(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trainer = printed(capsys, "--config", "small.yaml")["trainer"]
    assert names(trainer["callbacks"]) == [
        "Checkpoints", "LearningRateMonitor", "TokensPerSecond", "StopOnNonFinite",
        "SaveAndStopOnSignal", "SampleText", "AttentionMaps", "EMAWeights", "ValidateAtEnd",
        "RunReport", "RunSummary", "StepProgressBar",
    ]  # fmt: skip
    sample = trainer["callbacks"][5]["init_args"]["sample"]
    assert (sample["prompt"], sample["max_new_tokens"]) == ("ROMEO:\n", 60)
    assert trainer["callbacks"][7]["init_args"]["decay"] == 0.995
    assert names(trainer["logger"]) == ["SafeCSVLogger", "AutoWandbLogger"]
    assert trainer["logger"][1]["init_args"]["tags"] == ["small"]
    assert names(trainer["plugins"]) == ["AtomicCheckpointIO"]
    assert (trainer["precision"], trainer["num_sanity_val_steps"], trainer["devices"]) == ("bf16-mixed", 0, 1)


def test_a_config_laid_over_another_changes_one_name_and_keeps_the_others(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    over = tmp_path / "over.yaml"
    over.write_text("callbacks:\n  AttentionMaps: false\n  SampleText: {sample: {prompt: JULIET}}\n")
    trainer = printed(capsys, "--config", "small.yaml", "--config", str(over))["trainer"]
    order = names(trainer["callbacks"])
    assert "AttentionMaps" not in order and "EMAWeights" in order  # small.yaml's average stays
    (sample,) = [entry for entry in trainer["callbacks"] if class_name(entry) == "SampleText"]
    assert sample["init_args"]["sample"]["prompt"] == "JULIET"  # the later file's settings for the name


def test_the_printed_config_runs_as_the_same_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    first = printed(capsys, "--config", "small.yaml")
    path = tmp_path / "printed.yaml"
    path.write_text(yaml.safe_dump(first))
    assert printed(capsys, "--config", str(path)) == first  # applying the names again changes nothing


def test_an_unknown_name_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("callbacks:\n  SampleTxt: {}\n")
    assert train_main(["--config", "tiny.yaml", "--config", str(bad), "--print_config"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "'SampleTxt'" in line and "SampleText" in line and str(bad) in line
    assert "Checkpoints" in line and "ModelCheckpoint" not in line  # the names to use now


def test_the_help_leaves_the_former_names_out(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        train_main(["--help"])
    shown = capsys.readouterr().out
    assert "--callbacks.Checkpoints" in shown and "--loggers.AutoWandbLogger" in shown
    assert not any(f".{former} " in shown for former in FORMER_NAMES)


@pytest.mark.parametrize("config", sorted(path.name for path in (REPO / "configs").glob("*.yaml")))
def test_every_shipped_config_says_only_what_it_changes(config: str) -> None:
    text = (REPO / "configs" / config).read_text()
    assert "class_path: minigpt.training.callbacks" not in text and "logger:" not in text
    assert len(text.splitlines()) <= 45
    trainer = expanded(yaml.safe_load(text))["trainer"]
    assert {"Checkpoints", "ValidateAtEnd", "RunSummary"} <= set(names(trainer["callbacks"]))
