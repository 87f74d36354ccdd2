"""Configs as the benchmark scripts read them: YAML trees, dotted settings laid over them, and the
named variants of the training recipe (`VARIANTS`) that ablation.py and steps_quality.py train."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from minigpt.cli.train_defaults import expanded
from minigpt.data import DataConfig
from minigpt.training.callbacks.averaging import EMAWeights
from minigpt.training.config import OptimConfig

ROOT = Path(__file__).resolve().parents[2]
"""The repository root, where train.py and configs/ are."""

EMA = "minigpt.training.callbacks.averaging.EMAWeights"
"""The weight-averaging callback; a variant appends it to the config's callbacks."""


def find_config(name: str) -> Path:
    """The YAML file `name` stands for: a path from the working directory, else a file of that name
    in configs/ (where train.py looks), else one beside the scripts in benchmarks/ (`baby.yaml`,
    `modern-124m.yaml`)."""
    for path in (Path(name), ROOT / "configs" / name, ROOT / "benchmarks" / name):
        if path.is_file():
            return path
    raise SystemExit(f"error: no config {name!r} here, in configs/ or in benchmarks/")


def config_path(name: str) -> str:
    """`name` as train.py will find it from another working directory: a name in configs/ as it
    is, any other file by its absolute path."""
    path = find_config(name)
    return name if path == ROOT / "configs" / name else str(path.resolve())


def read_yaml(name: str) -> dict[str, Any]:
    """The config file as written: what every run does by default is not in it (`precision`)."""
    return yaml.safe_load(find_config(name).read_text(encoding="utf-8"))


def precision(config: dict[str, Any]) -> str:
    """The trainer's precision a config asks for, train.py's default where it names none."""
    return expanded(config)["trainer"]["precision"]


def dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A YAML tree's leaves as dotted settings: {"model": {"gpt": {"n_layer": 4}}} -> model.gpt.n_layer."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s values laid on top, section by section, as a second --config does."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(base[key], value) if isinstance(value, dict) and key in base else value
    return out


def cli_overrides(extra: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in extra.items():
        text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        out.append(f"--{key}={text}")
    return out


BABY = dotted(read_yaml("baby.yaml"))
"""nanoGPT's README "baby GPT" with a tiny context window, on a CPU (baby.yaml), as dotted settings."""

VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "muon": {"model.optim.optimizer": "muon"},
    "adamw": {"model.optim.optimizer": "adamw"},
    "muon_ns2": {"model.optim.optimizer": "muon", "model.optim.muon_ns_steps": 2},
    "qk_heads": {"model.optim.muon_qk_per_head": True},
    "qk_whole": {"model.optim.muon_qk_per_head": False},
    "v_heads": {"model.optim.muon_v_per_head": True},
    "v_whole": {"model.optim.muon_v_per_head": False},
    "gram_norm": {"model.optim.muon_ns_norm": "gram"},
    "frobenius_norm": {"model.optim.muon_ns_norm": "frobenius"},
    "muon_ns3": {"model.optim.optimizer": "muon", "model.optim.muon_ns_steps": 3},
    "muon_ns4": {"model.optim.optimizer": "muon", "model.optim.muon_ns_steps": 4},
    "muon_ns5": {"model.optim.optimizer": "muon", "model.optim.muon_ns_steps": 5},
    "polar": {"model.optim.muon_ns_coefficients": "polar_express"},
    "jordan": {"model.optim.muon_ns_coefficients": "jordan"},
    "rope": {"model.gpt.position_embedding": "rope"},
    "qk_norm": {"model.gpt.qk_norm": True},
    "rmsnorm": {"model.gpt.norm": "rmsnorm"},
    "relu2": {"model.gpt.activation": "relu2"},
    "zero_init": {"model.gpt.zero_init_proj": True},
    "ema": {"trainer.callbacks+": EMA, "trainer.callbacks.decay": 0.995},
    "ema99": {"trainer.callbacks+": EMA, "trainer.callbacks.decay": 0.99},
    "ema998": {"trainer.callbacks+": EMA, "trainer.callbacks.decay": 0.998},
    "untied": {"model.gpt.tie_weights": False},
    "tied": {"model.gpt.tie_weights": True},
    "wsd": {"model.optim.schedule": "wsd", "model.optim.decay_fraction": 0.4},
    "wsd25": {"model.optim.schedule": "wsd", "model.optim.decay_fraction": 0.25},
    "linear0": {"model.optim.schedule": "wsd", "model.optim.decay_fraction": 1.0, "model.optim.min_lr": 0.0},
    "lr_x2": {"model.optim.lr": "x2", "model.optim.min_lr": "x2"},
    "lr_half": {"model.optim.lr": "x0.5", "model.optim.min_lr": "x0.5"},
    "muon_lr_x2": {"model.optim.muon_lr": 0.04},
    "muon_lr_x1.5": {"model.optim.muon_lr": 0.03},
    "min_lr_x3": {"model.optim.min_lr": "x3"},
    "muon_lr_half": {"model.optim.muon_lr": 0.01},
    "dropout": {"model.gpt.dropout": 0.1},
    "dropout2": {"model.gpt.dropout": 0.2},
    "wd_x5": {"model.optim.weight_decay": "x5"},
    "wd_x10": {"model.optim.weight_decay": "x10"},
    "wd_0": {"model.optim.weight_decay": 0.0},
    "wd_x20": {"model.optim.weight_decay": "x20"},
    "emb_lr_x10": {"model.optim.embedding_lr": "x10"},
    "emb_lr_x30": {"model.optim.embedding_lr": "x30"},
    "deep6": {"model.gpt.n_layer": 6},
    "deep8": {"model.gpt.n_layer": 8},
    "batch_x2": {"data.config.batch_size": "x2"},
    "batch_x3": {"data.config.batch_size": "x3"},
    "batch_half": {"data.config.batch_size": "x0.5"},
    "ctx256": {"model.gpt.context_length": 256, "data.config.batch_size": "x0.5"},  # same tokens a step
    "dropout05": {"model.gpt.dropout": 0.05},
    "dropout3": {"model.gpt.dropout": 0.3},
    "vocab2048": {"data.config.vocab_size": 2048},
    "vocab8192": {"data.config.vocab_size": 8192},
    "wide384": {"model.gpt.n_embd": 384, "model.gpt.n_head": 6},
}
"""Each lever alone, as dotted settings of the config ("xF": the config's value times F); "a+b" in a
variant's name combines them. Levers that lost and left the model are no variants any more:
benchmarks/RESULTS.md names the commit that still runs them."""

RECIPE = ("rope", "relu2", "zero_init", "untied", "qk_norm")
"""The architecture levers that paid in 75-second and char.yaml-shape runs; "recipe" adds Muon to
them. char.yaml trains this recipe; small.yaml keeps its head tied, which won at its full length."""
VARIANTS["recipe_adamw"] = {k: v for name in RECIPE for k, v in VARIANTS[name].items()}
VARIANTS["recipe"] = {**VARIANTS["recipe_adamw"], **VARIANTS["muon"]}
VARIANTS["gpt2"] = dotted(read_yaml("recipes/gpt2.yaml"))
"""GPT-2's whole recipe (recipes/gpt2.yaml) as one variant, against a config's own."""


def settings(variant: str, config: dict[str, Any]) -> dict[str, Any]:
    """The variant's dotted settings, with "xF" factors applied to the config's values."""
    out: dict[str, Any] = {}
    for name in variant.split("+"):
        if name not in VARIANTS:
            raise SystemExit(f"error: unknown variant {name!r}; known: {', '.join(VARIANTS)}")
        for key, value in VARIANTS[name].items():
            if isinstance(value, str) and value.startswith("x"):
                value = float(value[1:]) * current(config, key)
                if key == "data.config.batch_size":
                    value = max(1, round(value))
            out[key] = value
    return out


def current(config: dict[str, Any], key: str) -> float:
    """The config's value at a dotted key, or the typed default where the config leaves it out."""
    *path, field = key.split(".")
    node: Any = config
    for part in path:
        node = node.get(part, {})
    default = DataConfig() if key.startswith("data.") else OptimConfig()
    value = node.get(field, getattr(default, field))
    if value is None and field == "embedding_lr":  # unset: the AdamW learning rate
        return current(config, "model.optim.lr")
    return float(value)


def section(config: dict[str, Any], extra: dict[str, Any], name: str) -> dict[str, Any]:
    """`model.<name>` of the config with the variant's settings for it applied."""
    values = dict(config["model"].get(name, {}))
    prefix = f"model.{name}."
    values.update({k[len(prefix) :]: v for k, v in extra.items() if k.startswith(prefix)})
    return values


def config_ema(config: dict[str, Any]) -> dict[str, Any] | None:
    """The config's own EMAWeights entry under `trainer.callbacks`, or None."""
    callbacks = expanded(config)["trainer"]["callbacks"]
    return next((c for c in callbacks if c.get("class_path") == EMA), None)


def ema_decay(config: dict[str, Any], extra: dict[str, Any]) -> float | None:
    """The decay of the EMAWeights the variant trains with (the config's or its own), or None."""
    if extra.get("trainer.callbacks+") == EMA:
        return float(extra.get("trainer.callbacks.decay", EMAWeights().decay))
    if (callback := config_ema(config)) is not None:
        return float((callback.get("init_args") or {}).get("decay", EMAWeights().decay))
    return None
