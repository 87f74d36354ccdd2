"""The train.py command line: config files, overrides, --print_config and one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from minigpt.cli.command import CONFIG_DIRS, resolve_config_args
from minigpt.cli.train import help_topic, train_main
from minigpt.common import UsageError
from minigpt.training.lit import LitGPT

from .helpers import parse

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def test_there_are_configs() -> None:
    assert {p.name for p in CONFIGS} >= {"tiny.yaml", "small.yaml", "char.yaml", "gpt2-124m.yaml"}


@pytest.mark.parametrize(
    "path",
    # Their shape comes from weights: test_finetune.py, tests/training/test_sft.py, test_lora.py,
    # test_dpo.py and test_rl.py.
    [p for p in CONFIGS if p.name not in ("finetune.yaml", "sft.yaml", "lora.yaml", "dpo.yaml", "rl.yaml")],
    ids=lambda p: p.name,
)
def test_every_config_parses_into_typed_objects(path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    cli = parse(
        "--config",
        str(path),
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "1",
        "--trainer.strategy",
        "auto",
    )
    model, data = cli.model, cli.datamodule
    assert model.gpt_config.n_layer == raw["model"]["gpt"]["n_layer"]
    assert model.gpt_config.n_embd == raw["model"]["gpt"]["n_embd"]
    assert model.optim_config.lr == pytest.approx(raw["model"]["optim"]["lr"])
    assert data.config.source == raw["data"]["config"]["source"]
    # The data windows always match the model's context.
    assert data.context_length == model.gpt_config.context_length
    assert cli.trainer.max_steps == raw["trainer"]["max_steps"]


def test_a_bare_config_name_resolves_in_configs() -> None:
    assert resolve_config_args(["--config", "small.yaml"]) == [
        "--config",
        str(REPO / "configs" / "small.yaml"),
    ]
    assert resolve_config_args(["--config=tiny"]) == ["--config=" + str(REPO / "configs" / "tiny.yaml")]
    assert CONFIG_DIRS[-1] == REPO / "configs"


def test_overrides_after_the_config_win() -> None:
    cli = parse(
        "--config",
        "tiny.yaml",
        "--model.gpt.n_layer",
        "3",
        "--model.gpt.context_length",
        "32",
        "--data.config.batch_size",
        "4",
        "--trainer.max_steps",
        "7",
    )
    assert cli.model.gpt_config.n_layer == 3
    assert cli.datamodule.context_length == 32
    assert cli.datamodule.config.batch_size == 4
    assert cli.trainer.max_steps == 7


@pytest.mark.parametrize("form", ["spaced", "joined"])
def test_a_data_setting_can_be_set_to_null(form: str) -> None:
    # The data module is a subclass setting: jsonargparse passed a nested null on as "None".
    option = ["--data.config.max_tokens", "null"]
    args = option if form == "spaced" else ["=".join(option)]
    cli = parse(
        "--config", "tiny.yaml", "--data.config.max_tokens", "500", *args, "--data.config.batch_size", "3"
    )  # fmt: skip
    assert cli.datamodule.config.max_tokens is None
    assert cli.datamodule.config.batch_size == 3
    assert cli.datamodule.config.source == parse("--config", "tiny.yaml").datamodule.config.source


def test_print_config_shows_every_section(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train_main(["--config", "tiny.yaml", "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert {"trainer", "model", "data", "ckpt_path", "seed_everything"} <= set(printed)
    # Ours first: the trainer's loggers and callbacks alone run to ~140 lines.
    assert list(printed)[:2] == ["model", "data"]
    assert list(printed).index("trainer") > list(printed).index("tokens_per_step")
    # The loggers and callbacks a run uses are in the config, not built in code.
    loggers = [entry["class_path"] for entry in printed["trainer"]["logger"]]
    assert loggers == ["minigpt.training.loggers.SafeCSVLogger", "minigpt.training.loggers.AutoWandbLogger"]
    callbacks = {entry["class_path"].rsplit(".", 1)[1] for entry in printed["trainer"]["callbacks"]}
    assert {"Checkpoints", "SampleText", "StopOnNonFinite", "SaveAndStopOnSignal"} <= callbacks
    assert printed["model"]["gpt"]["n_layer"] == 2
    assert {"lr", "warmup_steps", "weight_decay"} <= set(printed["model"]["optim"])


def test_help_shows_our_settings_and_says_where_lightnings_are(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train_main(["--help"])
    assert exit_info.value.code == 0
    ours = capsys.readouterr().out
    for option in ("--config", "--model.gpt.n_layer", "--model.optim.lr", "--data.config.batch_size"):
        assert option in ours
    assert "--trainer." not in ours.replace("--trainer.max_steps, --trainer.precision", "")
    assert "train.py --help trainer" in ours.split("options:")[0]  # said before the options

    with pytest.raises(SystemExit):
        train_main(["--help", "trainer"])
    lightnings = capsys.readouterr().out
    assert "--trainer.max_steps MAX_STEPS" in lightnings and "--trainer.precision" in lightnings
    assert "--model.gpt.n_layer" not in lightnings and "--data.config" not in lightnings
    assert len(ours.splitlines()) + len(lightnings.splitlines()) > 600  # nothing lost between them


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--help"], (["--help"], None)),
        (["--config", "tiny.yaml", "--help", "trainer"], (["--config", "tiny.yaml", "--help"], "trainer")),
        (["-h", "trainer"], (["-h"], "trainer")),
        (["--help=trainer"], (["--help"], "trainer")),
        (["--config", "trainer"], (["--config", "trainer"], None)),
    ],
)
def test_help_topic(args: list[str], expected: tuple[list[str], str | None]) -> None:
    assert help_topic(args) == expected


class LitProbe(LitGPT):
    """A LitGPT subclass with a setting of its own, as a config may name one."""

    def __init__(self, *args: Any, probe: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.probe = probe


def test_model_class_path_picks_a_litgpt_subclass_with_its_own_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"{__name__}.LitProbe"
    cli = parse("--config", "tiny.yaml", "--model.class_path", name, "--model.probe", "3")
    assert type(cli.model) is LitProbe and cli.model.probe == 3 and cli.model.gpt_config.n_layer == 2
    assert type(parse("--config", "tiny.yaml").model) is LitGPT  # a config that names none
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    raw["model"] |= {"class_path": name, "probe": 5}  # settings straight under model:, as without it
    config = tmp_path / "probe.yaml"
    config.write_text(yaml.safe_dump(raw))
    cli = parse("--config", str(config))
    assert type(cli.model) is LitProbe and cli.model.probe == 5
    with pytest.raises(SystemExit):  # the printed config names the class, so it runs again as it is
        train_main(["--config", str(config), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)["model"]
    assert printed["class_path"] == name and printed["probe"] == 5 and printed["gpt"]["n_layer"] == 2
    with pytest.raises(SystemExit):
        train_main(["--config", "tiny.yaml", "--print_config"])
    assert yaml.safe_load(capsys.readouterr().out)["model"]["class_path"] == "minigpt.training.lit.LitGPT"


def test_a_config_without_a_run_folder_prints_and_uses_the_default_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    del raw["trainer"]["default_root_dir"]
    config = tmp_path / "no-folder.yaml"
    config.write_text(yaml.safe_dump(raw))
    with pytest.raises(SystemExit):
        train_main(["--config", str(config), "--print_config"])
    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["default_root_dir"] == "runs/default"
    cli = parse("--config", str(config), "--trainer.accelerator", "cpu")
    assert cli.trainer.default_root_dir == "runs/default"
    assert cli.config.trainer.callbacks[0].init_args.dirpath == "runs/default/checkpoints"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "no-such.yaml"], "config file not found: no-such.yaml"),
        (["--config", "tiny.yaml", "--model.gpt.n_layr", "3"], "n_layr"),
        (["--config", "tiny.yaml", "--model.gpt.n_layer", "three"], "n_layer"),
        (
            ["--config", "tiny.yaml", "--model.gpt.n_embd", "100", "--model.gpt.n_head", "3"],
            "n_embd (100) must be divisible by n_head (3)",
        ),
        (["--config", "tiny.yaml", "--data.config.tokenizer", "wordpiece"], "unknown tokenizer 'wordpiece'"),
        (
            ["--config", "tiny.yaml", "--data.config.tokenizer", "bpe", "--data.config.vocab_size", "100"],
            "data.vocab_size 100 is too small for bpe: it needs the 256 bytes and 1 special token",
        ),
        (
            ["--config", "tiny.yaml", "--trainer.gradient_clip_val", "0.5"],
            "set gradient clipping with --model.optim.grad_clip, not --trainer.gradient_clip_val",
        ),
        (
            ["--config", "tiny.yaml", "--model.class_path", "minigpt.data.TextDataModule"],
            "model.class_path minigpt.data.TextDataModule is not a subclass of minigpt.training.lit.LitGPT",
        ),
        (
            ["--config", "tiny.yaml", "--model.class_path", "minigpt.training.NoSuchModule"],
            "model.class_path minigpt.training.NoSuchModule is not a subclass",
        ),
    ],
)
def test_bad_command_lines_get_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: ") and message in err[0]
    assert not any(tmp_path.iterdir())  # nothing was written


def test_yaml_syntax_error_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  gpt: {n_layer: 2\n")
    monkeypatch.chdir(tmp_path)
    assert train_main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


def test_missing_config_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        resolve_config_args(["--config", "definitely-missing.yaml"])


LEVERS = (
    "position_embedding",
    "qk_norm",
    "norm",
    "activation",
    "zero_init_proj",
    "tie_weights",
)


def test_gpt2s_recipe_is_one_config_away_from_the_modern_one() -> None:
    """small.yaml trains with the modern recipe; recipes/gpt2.yaml laid over it restores GPT-2's
    (GPTConfig's defaults, the seed-faithful architecture) and AdamW, and leaves the shape alone."""
    from minigpt.model import GPTConfig

    cpu = ("--trainer.accelerator", "cpu", "--trainer.devices", "1")
    modern = parse("--config", "small.yaml", *cpu).model
    gpt2 = parse("--config", "small.yaml", "--config", "recipes/gpt2.yaml", *cpu).model
    assert modern.optim_config.optimizer == "muon" and modern.gpt_config.position_embedding == "rope"
    assert {name: getattr(gpt2.gpt_config, name) for name in LEVERS} == {
        name: getattr(GPTConfig(), name) for name in LEVERS
    }
    assert gpt2.optim_config.optimizer == "adamw"
    shape = ("n_layer", "n_head", "n_embd", "context_length")
    assert [getattr(gpt2.gpt_config, n) for n in shape] == [getattr(modern.gpt_config, n) for n in shape]
