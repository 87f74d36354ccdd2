"""Any minigpt model as a transformers folder with custom code, and such a folder read back.

transformers computes GPT-2 itself (`hf_export.py` writes that layout when it suffices); the
modern recipe's levers (rotary positions, QK-norm, RMSNorm, squared ReLU) it does not. For those
the folder carries the code: minigpt's own model modules, copied at export from the installed
`minigpt.model` package (`model_sources`), and two small adapters kept in `remote_code/`: a
`PretrainedConfig` whose settings are `GPTConfig`'s, and a `PreTrainedModel` with a causal-LM head
that keeps its keys and values in transformers' cache. `config.json`'s `auto_map` names them, so
`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` loads the model.

minigpt reads such a folder without running any of its code: `config.json` holds `GPTConfig`'s
settings and `model.safetensors` the GPT's state dict under the adapter's `model.` prefix.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch

import minigpt.model
from minigpt.model import ConfigError, GPTConfig

from .convert import from_lightning
from .description import REMOVED_SETTINGS, with_legacy_settings
from .errors import CheckpointError

MODEL_TYPE = "minigpt"
"""`config.json`'s `model_type` for a folder with minigpt's code."""
ADAPTERS = Path(__file__).parent / "remote_code"
"""The transformers side, copied as they are: configuration_minigpt.py and modeling_minigpt.py."""
ENTRY_MODULE = "gpt"
"""The model module the adapters import; the modules it imports (and theirs) come with it."""
PREFIX = "minigpt_"
"""Put before each copied module's name, so the folder's files say whose they are."""
WEIGHT_PREFIX = "model."
"""The adapter holds minigpt's GPT as `self.model`."""
AUTO_MAP = {
    "AutoConfig": "configuration_minigpt.MiniGPTConfig",
    "AutoModelForCausalLM": "modeling_minigpt.MiniGPTForCausalLM",
}

MODEL_PACKAGE = Path(minigpt.model.__file__).parent
"""Where the copied modules come from: the installed `minigpt.model`."""

_RELATIVE_IMPORT = re.compile(r"^(\s*from\s+)\.(\w+)(\s+import\b)", re.M)


def model_sources(package: Path = MODEL_PACKAGE) -> dict[str, str]:
    """File name -> text of the minigpt model modules the adapters need: `gpt.py` and every module
    it imports from its package, found by reading their imports, each named `minigpt_<name>.py`
    with its relative imports renamed to match.

    Raises:
        ValueError: A module imports something other than the standard library, torch or its
            own package (a remote folder can only count on torch and transformers); a test
            stops such a change to model/ before any export meets it.
    """
    sources: dict[str, str] = {}
    pending = [ENTRY_MODULE]
    while pending:
        name = pending.pop()
        if f"{PREFIX}{name}.py" in sources:
            continue
        text = (package / f"{name}.py").read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level:
                if node.level != 1 or node.module is None:
                    raise ValueError(f"model/{name}.py: only `from .module import ...` can be copied")
                pending.append(node.module)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for top in _top_level_names(node):
                    if top != "torch" and top not in _STDLIB:
                        raise ValueError(
                            f"model/{name}.py imports {top}, which a remote folder cannot count on"
                        )
        header = f"# Copied from minigpt's model/{name}.py when this folder was exported.\n"
        sources[f"{PREFIX}{name}.py"] = header + _RELATIVE_IMPORT.sub(rf"\1.{PREFIX}\2\3", text)
    return sources


def _top_level_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [node.module.split(".")[0]] if node.module else []
    return [alias.name.split(".")[0] for alias in node.names]


_STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


def write_remote_code(folder: Path) -> list[str]:
    """Write the adapters and the model modules they import into `folder`; returns the file names."""
    files = model_sources()
    for adapter in sorted(ADAPTERS.glob("*.py")):
        files[adapter.name] = adapter.read_text(encoding="utf-8")
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return sorted(files)


def remote_code_config(config: GPTConfig, eot_id: int | None) -> dict[str, Any]:
    """`config.json` for the custom-code folder: `GPTConfig`'s settings as they are, with what
    transformers reads to find the code, tie the head and stop generating."""
    return {
        "architectures": ["MiniGPTForCausalLM"],
        "model_type": MODEL_TYPE,
        "auto_map": AUTO_MAP,
        **asdict(config),
        "tie_word_embeddings": config.tie_weights,
        "use_cache": True,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
    }


def to_remote_state(state: dict[str, torch.Tensor], tie_weights: bool) -> dict[str, torch.Tensor]:
    """The adapter's state dict from `GPT`'s: the `model.` prefix, the tied head stored once."""
    return {
        WEIGHT_PREFIX + key: value.detach().cpu().contiguous()
        for key, value in state.items()
        if not (tie_weights and key == "lm_head.weight")
    }


# -- reading ----------------------------------------------------------------------------------------


def gpt_config_from_remote(hf: dict[str, Any], origin: Path) -> GPTConfig:
    """Our config from a custom-code folder's `config.json`: the `GPTConfig` settings it holds
    (those it predates take their old values, as in our checkpoints); our code, never the folder's.

    Raises:
        CheckpointError: a setting is missing, invalid or one we removed, named in one line.
    """
    if not isinstance(hf.get("vocab_size"), int):
        raise CheckpointError(f"{origin} has no vocab_size")
    names = {field.name for field in fields(GPTConfig)} | set(REMOVED_SETTINGS)
    settings = {key: value for key, value in hf.items() if key in names}
    try:
        return GPTConfig(**with_legacy_settings(settings, f"{origin}"))
    except CheckpointError:
        raise
    except (ConfigError, TypeError) as err:
        raise CheckpointError(f"{origin}: {err}") from None


def from_remote_state(state: dict[str, torch.Tensor], tie_weights: bool) -> dict[str, torch.Tensor]:
    """`GPT`'s state dict from the adapter's (the inverse of `to_remote_state`)."""
    ours = from_lightning(state)  # the Lightning module holds the GPT under the same prefix
    if tie_weights and "transformer.wte.weight" in ours:
        ours["lm_head.weight"] = ours["transformer.wte.weight"]
    return ours
