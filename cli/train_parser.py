"""train.py's parser: `--help` shows our settings and `--help trainer` Lightning's,
`--print_config` puts ours first, and `--data.KEY null` reaches the data module as null."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser

from minigpt.common import UsageError
from minigpt.training.lightning_internals import help_showing

from .train_defaults import FORMER_NAMES

LIGHTNING_HELP = "trainer"
"""The topic of `--help trainer`: Lightning's own settings, which plain `--help` leaves out."""
LIGHTNING_KEYS = ("trainer", "optimizer", "lr_scheduler")
"""Lightning's settings: ~700 lines of `--help` and most of `--print_config`, so they come last."""


class TrainParser(LightningArgumentParser):
    """LightningCLI's parser, whose `--help` shows our settings (the model, its optimisation, the
    data, the run) and leaves Lightning's to `--help trainer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prog", "train.py")
        kwargs.setdefault("usage", "%(prog)s --config FILE [--config FILE ...] [--section.key VALUE ...]")
        kwargs.setdefault(
            "description",
            "Train a GPT. Settings come from --config files (a name in configs/, or a path), laid over "
            "each other in order, then from --section.key overrides; --print_config shows them all. "
            "Lightning's Trainer settings (--trainer.max_steps, --trainer.precision, loggers, "
            f"callbacks, ...) are left out here: see them with `%(prog)s --help {LIGHTNING_HELP}`.",
        )
        super().__init__(*args, **kwargs)
        self.help_topic: str | None = None
        self.default_data_class: type | None = None
        """The data module a config that names none gets; `--help` lists its settings."""

    def format_help(self, *args: Any, **kwargs: Any) -> str:
        lightning = self.help_topic == LIGHTNING_HELP
        description = self.description
        if lightning:
            self.description = (
                "Lightning's settings for train.py: the Trainer's (--trainer.*) and LightningCLI's "
                "--optimizer and --lr_scheduler. `%(prog)s --help` shows the model's, the data's "
                "and the run's."
            )
        try:
            # Neither argparse nor jsonargparse can leave a group out of the help: see help_showing.
            with help_showing(
                self, lambda action: is_lightnings(action.dest) == lightning and not former(action.dest)
            ):
                text = super().format_help(*args, **kwargs)
        finally:
            self.description = description
        if lightning or self.default_data_class is None:
            return text
        return text + "\n" + self.data_help(self.default_data_class)

    def data_help(self, data_class: type) -> str:
        """The settings of `data_class` as `--data.*` options: a config that names no data module
        gets it, and the parser of any data module lists only `--data` (what `--data.help` shows)."""
        name = f"{data_class.__module__}.{data_class.__qualname__}"
        description = (
            f"The data, {name} unless the config picks another with data.class_path "
            "(`%(prog)s --data.help CLASS` lists another's settings):"
        )
        helper = LightningArgumentParser(
            prog=self.prog, usage=argparse.SUPPRESS, description=description, add_help=False
        )
        helper.add_class_arguments(data_class, "data")
        return helper.format_help()


def is_lightnings(key: str) -> bool:
    """Whether a setting (`trainer.max_steps`, `optimizer`, ...) is Lightning's rather than ours."""
    return key.split(".", 1)[0] in LIGHTNING_KEYS


def former(key: str) -> bool:
    """Whether a setting is a class's former name under `callbacks:` or `loggers:`, which a config
    may still use but the help leaves out."""
    section, _, name = key.partition(".")
    return section in ("callbacks", "loggers") and name in FORMER_NAMES


def help_topic(args: list[str]) -> tuple[list[str], str | None]:
    """`--help trainer` (or `--help=trainer`) as `--help` and its topic; other arguments as they are."""
    # jsonargparse's --help takes no topic.
    for i, arg in enumerate(args):
        if arg in ("-h", "--help") and args[i + 1 : i + 2] == [LIGHTNING_HELP]:
            return args[: i + 1] + args[i + 2 :], LIGHTNING_HELP
        if arg == f"--help={LIGHTNING_HELP}":
            return [*args[:i], "--help", *args[i + 1 :]], LIGHTNING_HELP
    return args, None


YAML_NULLS = frozenset({"null", "Null", "NULL", "~"})


def data_nulls_as_dicts(args: list[str]) -> list[str]:
    """`args` with each `--data.KEY null` written as `--data={"init_args": {KEY: null}}`.

    `data` is a subclass setting, and jsonargparse (4.x) hands a nested option on to the data
    module's parser as the text `--KEY=None`, which a setting typed `int | None` refuses: so
    `--data.config.max_tokens null` failed where `--model.gpt.KEY null` works. A dict given to
    `--data` merges with the settings before it, as the option would have.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        arg, taken = args[i], 1
        key = value = None
        if arg.startswith("--data.") and not arg.startswith("--data.class_path"):
            if "=" in arg:
                key, value = arg.removeprefix("--data.").split("=", 1)
            elif i + 1 < len(args):
                key, value, taken = arg.removeprefix("--data."), args[i + 1], 2
        if key and value in YAML_NULLS:
            nested: Any = None
            for part in reversed(key.removeprefix("init_args.").split(".")):
                nested = {part: nested}
            out.append("--data=" + json.dumps({"init_args": nested}))
        else:
            out.append(arg)
            taken = 1
        i += taken
    return out


def ours_first(config: Namespace) -> Namespace:
    """`config` with the model, the data and the run's settings before Lightning's, as
    `--print_config` shows them (the trainer's loggers and callbacks alone run to ~140 lines)."""
    items = vars(config)
    order = sorted(items, key=lambda key: (is_lightnings(key), key not in ("model", "data")))
    return Namespace(**{key: items[key] for key in order})


def model_class_named(args: list[str], default: type) -> type:
    """The LightningModule `model.class_path` names in the config files and options of `args`
    (the last one that names it wins, as jsonargparse lays them), `default` where none does.

    Read before the parser is built, since the class's signature is what `model:` accepts: the
    settings stay straight under `model:` (no `init_args`), as in a config that names no class.
    `args` hold the config files as paths (`resolve_config_args`)."""
    named: str | None = None
    for i, arg in enumerate(args):
        option, _, value = arg.partition("=")
        if not value and i + 1 < len(args):
            value = args[i + 1]
        if option == "--config" and value and Path(value).is_file():
            config = yaml.safe_load(Path(value).read_text(encoding="utf-8"))
            model = config.get("model") if isinstance(config, dict) else None
            if isinstance(model, dict) and model.get("class_path"):
                named = model["class_path"]
        elif option == "--model.class_path" and value:
            named = value
    if named is None or named == class_path(default):
        return default
    found = class_at(str(named))
    if not (isinstance(found, type) and issubclass(found, default)):
        raise UsageError(
            f"model.class_path {named} is not a subclass of {class_path(default)} "
            "(give its full import path, such as minigpt.training.dpo.LitDPO)"
        )
    return found


def class_path(cls: type) -> str:
    """The import path a config names `cls` by."""
    return f"{cls.__module__}.{cls.__qualname__}"


def class_at(path: str) -> Any:
    """What the import path `path` names (`class_path`'s inverse); None where nothing is there."""
    module_name, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name, None) if module_name else None
    except ImportError:
        return None
