"""Model folders in the Hugging Face layout, read (from a path or a hub name).

A folder holds `config.json`, the weights (`model.safetensors`, sharded safetensors with an index,
or `pytorch_model.bin`) and the tokenizer's files. Two kinds are read: GPT-2's (`model_type`
gpt2), whose config is mapped onto `GPTConfig`, refusing what our model cannot compute, and
minigpt's own with custom code (`hf_remote.py`), whose config is `GPTConfig`'s. Either is read by
our code alone: nothing here imports transformers or runs code a folder carries. Writing is
`hf_export.py`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from minigpt.common import atomic_write, one_line
from minigpt.data import spec_from_hf_tokenizer_json
from minigpt.data.cache import cache_dir
from minigpt.data.gpt2_encoding import CACHE_FILE_NAME, N_VOCAB
from minigpt.data.tokenizer.gpt2 import GPT2_SPEC
from minigpt.model import GPT, ConfigError, GPTConfig

from .convert import from_hf_gpt2, hf_gpt2_parameters, to_hf_gpt2
from .description import describe
from .errors import CheckpointError
from .hf_remote import MODEL_TYPE, from_remote_state, gpt_config_from_remote
from .hf_tokenizer import VOCAB_FILE, gpt2_ranks_from_vocabulary
from .pickled import load_tensors_only

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_SPEC_FILE = "minigpt_tokenizer.json"
"""Written beside the model when its tokenizer is not GPT-2's (compact, char), so minigpt's tools
rebuild exactly the tokenizer it was trained with."""

ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}
"""transformers' `activation_function` names of the two GELUs our MLP computes."""

HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
"""What a model id on the Hugging Face hub looks like: `gpt2`, `openai-community/gpt2-medium`."""
HUB_FILES = [
    CONFIG_FILE,
    "generation_config.json",
    VOCAB_FILE,
    "merges.txt",
    SAFETENSORS_FILE,
    TOKENIZER_SPEC_FILE,
    TOKENIZER_JSON,
]


def is_gpt2_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG_FILE).is_file()


# -- reading ----------------------------------------------------------------------------------------


def gpt_config_from_hf(hf: dict[str, Any], origin: Path) -> GPTConfig:
    """Our model config for a GPT-2 `config.json`; missing settings take GPT-2's defaults, as in
    transformers. GPT-2 has every bias, so the model gets them all.

    Raises:
        CheckpointError: naming the setting our model cannot compute.
    """

    def refuse(key: str, why: str) -> CheckpointError:
        return CheckpointError(f"{origin / CONFIG_FILE}: {key} is {hf.get(key)!r}; {why}")

    if hf.get("model_type") != "gpt2":
        raise refuse("model_type", "minigpt reads GPT-2 models only")
    n_embd = hf.get("n_embd", 768)
    if hf.get("n_inner") not in (None, 4 * n_embd):
        raise refuse("n_inner", f"minigpt's MLP is 4 x n_embd = {4 * n_embd} wide")
    activation = hf.get("activation_function", "gelu_new")
    if activation not in ACTIVATIONS:
        raise refuse("activation_function", f"minigpt's MLP computes one of {', '.join(ACTIVATIONS)}")
    if hf.get("scale_attn_weights", True) is not True:
        raise refuse("scale_attn_weights", "minigpt always scales attention scores by 1/sqrt(head size)")
    if hf.get("scale_attn_by_inverse_layer_idx", False):
        raise refuse("scale_attn_by_inverse_layer_idx", "minigpt does not scale attention by layer")
    if hf.get("add_cross_attention", False):
        raise refuse("add_cross_attention", "minigpt is a decoder only")
    try:
        return GPTConfig(
            vocab_size=hf.get("vocab_size", N_VOCAB),
            context_length=hf.get("n_positions", 1024),
            n_layer=hf.get("n_layer", 12),
            n_head=hf.get("n_head", 12),
            n_embd=n_embd,
            qkv_bias=True,
            bias=True,
            tie_weights=hf.get("tie_word_embeddings", True),
            gelu_approximate=ACTIVATIONS[activation],
            layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        )
    except (ConfigError, TypeError) as err:
        raise CheckpointError(f"{origin / CONFIG_FILE}: {err}") from None


def read_hf_config(folder: Path) -> dict[str, Any]:
    try:
        hf = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {folder / CONFIG_FILE}: {err}") from None
    if not isinstance(hf, dict):
        raise CheckpointError(f"{folder / CONFIG_FILE} is not a JSON object")
    return hf


def tokenizer_spec_of(folder: Path, vocab_size: int) -> dict[str, Any]:
    """The tokenizer of a model folder, as a spec `tokenizer_from_spec` rebuilds.

    Ours (`minigpt_tokenizer.json`) when the folder has one; GPT-2's when it has GPT-2's
    `vocab.json`, which is then also stored as our cached GPT-2 ranks, so the tokenizer (and a
    fine-tune's data preparation) needs no network; the one a `tokenizer.json` of ours describes
    (a folder transformers saved again keeps that file and drops ours); GPT-2's, fetched as
    usual, for weights alone.
    """
    own = folder / TOKENIZER_SPEC_FILE
    if own.is_file():
        try:
            spec = json.loads(own.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"cannot read {own}: {err}") from None
        if not isinstance(spec, dict):
            raise CheckpointError(f"{own} is not a tokenizer spec")
        return spec
    if (folder / VOCAB_FILE).is_file():
        ranks = gpt2_ranks_from_vocabulary(folder / VOCAB_FILE)
        cached = cache_dir() / CACHE_FILE_NAME
        if not cached.is_file():
            try:
                with atomic_write(cached) as tmp:
                    tmp.write_bytes(ranks)
            except OSError:
                pass  # the tokenizer is then loaded the usual way
        return dict(GPT2_SPEC)
    if (folder / TOKENIZER_JSON).is_file():
        try:
            hf_json = json.loads((folder / TOKENIZER_JSON).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"cannot read {folder / TOKENIZER_JSON}: {err}") from None
        spec = spec_from_hf_tokenizer_json(hf_json, vocab_size) if isinstance(hf_json, dict) else None
        if spec is None:
            raise CheckpointError(
                f"{folder / TOKENIZER_JSON} is not a tokenizer minigpt writes (char, gpt2-compact, ...), "
                f"and the folder has no {TOKENIZER_SPEC_FILE}"
            )
        return spec
    if vocab_size >= N_VOCAB:
        return dict(GPT2_SPEC)
    raise CheckpointError(
        f"{folder} has neither {VOCAB_FILE} nor {TOKENIZER_SPEC_FILE}, and its {vocab_size} token ids are "
        f"fewer than GPT-2's {N_VOCAB}: cannot tell which tokenizer it was trained with"
    )


def is_remote_code_folder(folder: Path) -> bool:
    """Whether `config.json` says the folder holds minigpt's model with custom code."""
    return read_hf_config(folder).get("model_type") == MODEL_TYPE


def read_hf_description(folder: Path) -> dict[str, Any]:
    """The description (`describe`'s) of the model in a GPT-2 or minigpt folder."""
    hf = read_hf_config(folder)
    if hf.get("model_type") == MODEL_TYPE:
        config = gpt_config_from_remote(hf, folder / CONFIG_FILE)
    else:
        config = gpt_config_from_hf(hf, folder)
    return describe(config, tokenizer_spec_of(folder, config.vocab_size))


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The state dict in a folder: safetensors (one file, or shards with an index) preferred,
    else `pytorch_model.bin` read with `weights_only` (a pickle must not run code)."""
    try:
        if (folder / SAFETENSORS_FILE).is_file():
            return load_file(folder / SAFETENSORS_FILE)
        if (folder / SAFETENSORS_INDEX).is_file():
            index = json.loads((folder / SAFETENSORS_INDEX).read_text(encoding="utf-8"))
            state: dict[str, torch.Tensor] = {}
            for shard in sorted(set(index["weight_map"].values())):
                state |= load_file(folder / shard)
            return state
    except (SafetensorError, OSError, KeyError, TypeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read the weights in {folder}: {one_line(err)}") from None
    if (folder / PICKLE_FILE).is_file():
        path = folder / PICKLE_FILE
        state = load_tensors_only(path, f"cannot read {path}")
        if not isinstance(state, dict):
            raise CheckpointError(f"{path} is not a state dict")
        return state
    raise CheckpointError(f"{folder} has {CONFIG_FILE} but no {SAFETENSORS_FILE} or {PICKLE_FILE}")


def check_hf_state(hf_state: dict[str, torch.Tensor], config: GPTConfig, origin: Path) -> None:
    """Every tensor GPT-2 of this config has, of the right shape, and nothing else; else one line
    naming the first offending key in GPT-2's layout."""
    with torch.device("meta"):
        expected = to_hf_gpt2(GPT(config).state_dict(), config.n_layer, config.tie_weights)
    found = hf_gpt2_parameters(hf_state)
    if config.tie_weights:
        found.pop("lm_head.weight", None)  # saved by some versions although tied
    for key, tensor in expected.items():
        if key not in found:
            raise CheckpointError(f"{origin} lacks {key}, which GPT-2 with this config.json has")
        if found[key].shape != tensor.shape:
            raise CheckpointError(
                f"{origin}: {key} has shape {tuple(found[key].shape)}, "
                f"but config.json implies {tuple(tensor.shape)}"
            )
    extra = sorted(set(found) - set(expected))
    if extra:
        raise CheckpointError(f"{origin} holds {extra[0]}, which GPT-2 with this config.json does not have")


def hf_weights_loader(folder: Path, config: GPTConfig) -> Callable[[torch.nn.Module], None]:
    """Loads a folder's weights into a model built from its description (read when called)."""
    remote = is_remote_code_folder(folder)

    def load(model: torch.nn.Module) -> None:
        hf_state = read_hf_weights(folder)
        if remote:  # our GPT's own state dict: a missing or extra key is load_state_dict's error
            model.load_state_dict(from_remote_state(hf_state, config.tie_weights))
            return
        check_hf_state(hf_state, config, folder)
        model.load_state_dict(from_hf_gpt2(hf_state, config.n_layer, config.tie_weights))

    return load


def fetch_from_hub(name: str) -> Path:
    """The local folder of hub model `name`, downloaded (config, tokenizer, weights) if not cached.

    Raises:
        CheckpointError: No such model, or the hub cannot be reached (one line saying what to do).
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        folder = Path(
            snapshot_download(name, allow_patterns=HUB_FILES + [SAFETENSORS_INDEX, "model-*.safetensors"])
        )
        if not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(name, allow_patterns=HUB_FILES + [PICKLE_FILE]))
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"checkpoint not found: {name} is neither a local file or folder "
            "nor a model on the Hugging Face hub"
        ) from None
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"checkpoint not found: {name} is not a local file or folder, and the Hugging Face hub cannot be "
            f"reached to fetch a model of that name; pass a local folder holding {CONFIG_FILE} and "
            f"{SAFETENSORS_FILE} (or a run folder or checkpoint file)"
        ) from None
    except Exception as err:
        raise CheckpointError(
            f"checkpoint not found: {name} is not a local file or folder, and fetching it from "
            f"the Hugging Face hub failed ({one_line(err, with_type=True)})"
        ) from None
    return folder
