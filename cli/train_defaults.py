"""What every run does unless its config says otherwise, and how a config changes it by name.

- The trainer's settings, loggers, callbacks and plugins below are the parser's defaults, so a
  config holds only what makes it different and `--print_config` still lists all of them.
- `callbacks:` and `loggers:` at the top of a config change that set by class name: a mapping of
  settings merges into the entry of that name (added at its place in `CALLBACK_ORDER` if the set
  lacks it), `false` removes it. Config files laid over each other merge these by name; a class
  not named here joins with `--trainer.callbacks+=CLASS`, as in any LightningCLI.

      callbacks:
        SampleText: {sample: {prompt: "ROMEO:\\n"}}  # set
        EMAWeights: {decay: 0.995}                   # add
        AttentionMaps: false                          # remove
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import field, fields, make_dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

from minigpt.common import UsageError

TRAINER = {
    "accelerator": "auto",
    "devices": 1,
    "precision": "bf16-mixed",  # fp32 where the CPU has no native bf16 (training/precision.py)
    "check_val_every_n_epoch": None,  # validate every val_check_interval steps, across epochs
    "num_sanity_val_steps": 0,
    "enable_model_summary": False,  # RunSummary says what the model is, FLOPs included
    "log_every_n_steps": 10,
}
"""Lightning's Trainer settings that differ from Lightning's own defaults in every shipped config."""

KNOWN = {
    "Checkpoints": "minigpt.training.callbacks.checkpoints.Checkpoints",
    "LearningRateMonitor": "lightning.pytorch.callbacks.LearningRateMonitor",
    "TokensPerSecond": "minigpt.training.callbacks.throughput.TokensPerSecond",
    "StopOnNonFinite": "minigpt.training.callbacks.guards.StopOnNonFinite",
    "SaveAndStopOnSignal": "minigpt.training.callbacks.guards.SaveAndStopOnSignal",
    "SampleText": "minigpt.training.callbacks.dashboard.SampleText",
    "AttentionMaps": "minigpt.training.callbacks.dashboard.AttentionMaps",
    "EMAWeights": "minigpt.training.callbacks.averaging.EMAWeights",
    "EvaluateTasks": "minigpt.training.callbacks.lm_eval_tasks.EvaluateTasks",
    "EarlyStopping": "lightning.pytorch.callbacks.EarlyStopping",
    "ValidateAtEnd": "minigpt.training.callbacks.validate_at_end.ValidateAtEnd",
    "RunReport": "minigpt.training.callbacks.dashboard.RunReport",
    "RunSummary": "minigpt.training.callbacks.console.RunSummary",
    "StepProgressBar": "minigpt.training.callbacks.console.StepProgressBar",
    "SafeCSVLogger": "minigpt.training.loggers.SafeCSVLogger",
    "AutoWandbLogger": "minigpt.training.loggers.AutoWandbLogger",
}
"""The class of each name a config may use under `callbacks:` or `loggers:`."""

FORMER_NAMES = {
    "ModelCheckpoint": "Checkpoints",
    "CSVLogger": "SafeCSVLogger",
    "WandbLogger": "AutoWandbLogger",
}
"""Names our classes had when they were named like Lightning's, still taken under `callbacks:`
and `loggers:` (`--loggers.WandbLogger false`) for the class of the new name; `--help` and
`--print_config` show only the new one."""

FORMER_CLASS_PATHS = {
    f"{KNOWN[new].rpartition('.')[0]}.{old}": KNOWN[new] for old, new in FORMER_NAMES.items()
}
"""The class path of each former name, as a run folder's config.yaml written then holds it, and the
class's path now. It still resolves (the class's module keeps the former name for it), and reads
as the new name wherever a config's entries are matched by name."""

CALLBACK_ORDER = [name for name in KNOWN if not name.endswith("Logger")]
"""Where a callback added by name goes. Order matters where hooks share state: the weight average
comes after the sample and the attention maps, which then draw from the averaged weights, and
before the last validation and the report."""

CALLBACKS = [
    {"class_path": KNOWN["Checkpoints"], "init_args": {
        # dirpath null: <run folder>/checkpoints, where --ckpt_path last looks
        "filename": "best", "monitor": "val_loss", "mode": "min", "save_top_k": 1, "save_last": True,
        "auto_insert_metric_name": False, "enable_version_counter": False,
    }},
    {"class_path": KNOWN["LearningRateMonitor"], "init_args": {"logging_interval": "step"}},
    {"class_path": KNOWN["TokensPerSecond"]},  # also tokens seen, and MFU where the peak is known
    {"class_path": KNOWN["StopOnNonFinite"]},
    {"class_path": KNOWN["SaveAndStopOnSignal"]},
    {"class_path": KNOWN["SampleText"]},  # a sample at each validation
    {"class_path": KNOWN["AttentionMaps"]},  # <run>/attention/*.png and wandb, each validation
    {"class_path": KNOWN["ValidateAtEnd"]},  # the last step validates, whatever the interval
    {"class_path": KNOWN["RunReport"]},  # <run>/loss_curves.png and report.html at the end
    {"class_path": KNOWN["RunSummary"]},  # what the run will do, and a closing line
    {"class_path": KNOWN["StepProgressBar"]},  # counts the run's steps, with its ETA
]  # fmt: skip

LOGGERS = [
    {"class_path": KNOWN["SafeCSVLogger"]},  # save_dir null: the run folder
    # online when logged in, else offline; WANDB_MODE=disabled: off
    {"class_path": KNOWN["AutoWandbLogger"], "init_args": {"project": "minigpt", "mode": "auto"}},
]


def by_name_settings(name: str, names: list[str]) -> type:
    """A dataclass with one optional field per name and per former name of one, each a mapping of
    settings or a switch."""
    names = names + [old for old, new in FORMER_NAMES.items() if new in names]
    return make_dataclass(name, [(each, dict[str, Any] | bool | None, field(default=None)) for each in names])


Callbacks = by_name_settings("Callbacks", CALLBACK_ORDER)
"""`callbacks:`, a field per name: null leaves the callback as it is, a mapping sets (or adds) it,
false removes it. Fields rather than one mapping, so that config files merge name by name."""

LOGGER_NAMES = [name for name in KNOWN if name.endswith("Logger")]

Loggers = by_name_settings("Loggers", LOGGER_NAMES)
"""`loggers:`, as `Callbacks`."""

PLUGINS = [
    {"class_path": "minigpt.training.callbacks.checkpoints.AtomicCheckpointIO"}
]  # checkpoints written atomically


def parser_defaults() -> dict[str, Any]:
    """The defaults train.py's parser takes, by dotted key."""
    defaults = {f"trainer.{key}": value for key, value in TRAINER.items()}
    defaults |= {"trainer.callbacks": CALLBACKS, "trainer.logger": LOGGERS, "trainer.plugins": PLUGINS}
    return copy.deepcopy(defaults)


def class_name(entry: dict[str, Any]) -> str:
    """The name `callbacks:` or `loggers:` calls `entry`'s class by (the new one for a former
    class path)."""
    path = entry["class_path"]
    return FORMER_CLASS_PATHS.get(path, path).rsplit(".", 1)[-1]


def by_name(entries: list[dict[str, Any]], changes: dict[str, Any], order: list[str]) -> list[dict[str, Any]]:
    """`entries` (class_path / init_args dicts) with `changes` applied: each name's settings merged
    into its entry or a new entry placed by `order`, `false` removing it, null leaving it as it is."""
    out = copy.deepcopy(entries)
    for name, settings in under_new_names(changes).items():
        if settings is None:
            continue
        at = [i for i, entry in enumerate(out) if class_name(entry) == name]
        if settings is False:
            out = [entry for i, entry in enumerate(out) if i not in at]
            continue
        if settings is True:
            settings = {}
        if not isinstance(settings, dict):
            raise UsageError(f"{name}: give its settings as a mapping, or false to remove it")
        if at:
            for i in at:
                merge(out[i].setdefault("init_args", {}), settings)
            continue
        entry = {"class_path": KNOWN[name], "init_args": copy.deepcopy(settings)}
        out.insert(place(out, name, order), entry)
    return out


def under_new_names(changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` by name with each former name's change (`FORMER_NAMES`) folded into its new
    name's, as if made after it: the same changes, under one name a class."""
    out = {name: value for name, value in changes.items() if name not in FORMER_NAMES}
    for old, new in FORMER_NAMES.items():
        earlier, later = out.get(new), changes.get(old)
        if later is None:
            continue
        if later is True:  # added where missing: settings given under the new name stay
            later = earlier if isinstance(earlier, dict) else True
        elif isinstance(later, dict) and isinstance(earlier, dict):
            later = merge(copy.deepcopy(earlier), later)
        out[new] = later
    return out


def place(entries: list[dict[str, Any]], name: str, order: list[str]) -> int:
    """The index a new entry `name` goes at: before the first entry `order` puts after it."""
    if name not in order:
        return len(entries)
    later = set(order[order.index(name) + 1 :])
    return next((i for i, entry in enumerate(entries) if class_name(entry) in later), len(entries))


def merge(into: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Merge `settings` into `into`, mappings key by key; returns `into`."""
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


def expanded(config: dict[str, Any]) -> dict[str, Any]:
    """A config file's settings with the defaults filled in and `callbacks:` / `loggers:` applied,
    as the trainer will see them (for code that reads a YAML without the parser)."""
    out = copy.deepcopy(config)
    trainer = out.setdefault("trainer", {})
    for key, value in parser_defaults().items():
        trainer.setdefault(key.removeprefix("trainer."), value)
    trainer["callbacks"] = by_name(trainer["callbacks"], out.pop("callbacks", None) or {}, CALLBACK_ORDER)
    trainer["logger"] = by_name(trainer["logger"], out.pop("loggers", None) or {}, [])
    return out


def check_names(args: Sequence[str]) -> None:
    """Refuse a name under `callbacks:` or `loggers:` in the config files of `args` that names no
    class here (jsonargparse drops an unknown key of a dataclass without a word)."""
    files = [value for option, value in zip(args, args[1:], strict=False) if option == "--config"]
    files += [arg.removeprefix("--config=") for arg in args if arg.startswith("--config=")]
    for file in files:
        try:
            config = yaml.safe_load(Path(file).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue  # the parser says what is wrong with the file
        for key, kind in (("callbacks", Callbacks), ("loggers", Loggers)):
            given = config.get(key) if isinstance(config, dict) else None
            known = [f.name for f in fields(kind) if f.name not in FORMER_NAMES]
            for name in given if isinstance(given, dict) else []:
                if FORMER_NAMES.get(name, name) not in known:
                    raise UsageError(
                        f"{file}: {key}: no {key[:-1]} is named {name!r}; the names: {', '.join(known)} "
                        f"(another class: --trainer.{'callbacks' if kind is Callbacks else 'logger'}+=CLASS)"
                    )


def use_new_names(config: Namespace) -> None:
    """The config under the classes' new names (`FORMER_NAMES`), as --print_config and the
    run's config.yaml show it: changes given under a former name in `callbacks:` and
    `loggers:` moved to the new name, and former class paths in the trainer's lists (an older
    run's config.yaml) replaced by the new ones, which name the same classes."""
    for key in ("callbacks", "loggers"):
        given = config.get(key)
        if given is None:
            continue
        changes = under_new_names(vars(given))
        for name in FORMER_NAMES:
            if name in given:
                del given[name]
        for name, value in changes.items():
            given[name] = value
    for key in ("callbacks", "logger"):
        for entry in entries_of(config.trainer.get(key)):
            entry.class_path = FORMER_CLASS_PATHS.get(entry.class_path, entry.class_path)


def entries_of(value: Any) -> list[Namespace]:
    """The class_path entries of a `trainer.logger` or `trainer.callbacks` value (one or a list)."""
    items = value if isinstance(value, list) else [value]
    return [item for item in items if isinstance(item, Namespace) and item.get("class_path")]


def place_in_run_folder(trainer: Namespace, run_dir: Path) -> None:
    """Point the paths the YAML leaves null into the run folder: loggers' `save_dir`, and the
    `dirpath` of Checkpoints or Lightning's ModelCheckpoint (`<run>/checkpoints`, where
    `--ckpt_path last` looks)."""
    for entry in entries_of(trainer.get("logger")):
        if "save_dir" in entry.init_args and entry.init_args.save_dir is None:
            entry.init_args.save_dir = str(run_dir)
    for entry in entries_of(trainer.get("callbacks")):
        checkpoints = entry.class_path.endswith((".Checkpoints", ".ModelCheckpoint"))
        if checkpoints and entry.init_args.get("dirpath") is None:
            entry.init_args.dirpath = str(run_dir / "checkpoints")
