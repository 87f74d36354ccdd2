"""GPT-2 in the Hugging Face layout: read a model folder (or a hub name), write one.

A folder holds `config.json` (GPT-2's settings), the weights (`model.safetensors`, sharded
safetensors with an index, or `pytorch_model.bin`) and, for GPT-2's tokenizer, `vocab.json` and
`merges.txt`. Reading maps the config onto `GPTConfig` and refuses what our model cannot compute;
writing produces a folder `transformers.GPT2LMHeadModel.from_pretrained` loads without custom code.
Nothing here imports transformers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from minigpt.common import atomic_write, one_line
from minigpt.data import Tokenizer
from minigpt.data.cache import cache_dir
from minigpt.data.gpt2_encoding import CACHE_FILE_NAME, N_VOCAB
from minigpt.data.tokenizer.gpt2 import GPT2_SPEC, GPT2Tokenizer
from minigpt.model import GPT, ConfigError, GPTConfig

from .convert import from_hf_gpt2, hf_gpt2_parameters, to_hf_gpt2
from .description import describe
from .errors import CheckpointError
from .hf_tokenizer import VOCAB_FILE, gpt2_ranks_from_vocabulary, write_gpt2_vocabulary
from .pickled import load_tensors_only

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
TOKENIZER_SPEC_FILE = "minigpt_tokenizer.json"
"""Written beside the model when its tokenizer has no Hugging Face equivalent (compact, char),
so minigpt's tools still read the folder."""

ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}
"""transformers' `activation_function` names of the two GELUs our MLP computes."""
EXPORTED_ACTIVATION = {"tanh": "gelu_new", "none": "gelu"}

HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
"""What a model id on the Hugging Face hub looks like: `gpt2`, `openai-community/gpt2-medium`."""
HUB_FILES = ["config.json", "generation_config.json", "vocab.json", "merges.txt", "model.safetensors"]


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
    fine-tune's data preparation) needs no network; GPT-2's, fetched as usual, for weights alone.
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
    if vocab_size >= N_VOCAB:
        return dict(GPT2_SPEC)
    raise CheckpointError(
        f"{folder} has neither {VOCAB_FILE} nor {TOKENIZER_SPEC_FILE}, and its {vocab_size} token ids are "
        f"fewer than GPT-2's {N_VOCAB}: cannot tell which tokenizer it was trained with"
    )


def read_hf_description(folder: Path) -> dict[str, Any]:
    """The description (`describe`'s) of the model in a GPT-2 folder."""
    config = gpt_config_from_hf(read_hf_config(folder), folder)
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

    def load(model: torch.nn.Module) -> None:
        hf_state = read_hf_weights(folder)
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


# -- writing ----------------------------------------------------------------------------------------


def gpt2_cannot_compute(config: GPTConfig) -> list[str]:
    """What of `config` no GPT-2 setting of transformers computes (empty: exportable)."""
    reasons = {
        "rotary position embeddings": config.position_embedding != "learned",
        "normalised queries and keys (qk_norm)": config.qk_norm,
        "RMSNorm": config.norm != "layernorm",
        "the squared-ReLU MLP": config.activation != "gelu",
    }
    return [reason for reason, applies in reasons.items() if applies]


def hf_config(config: GPTConfig, eot_id: int | None) -> dict[str, Any]:
    """GPT-2's `config.json` for a model of `config`: the function our model computes, in
    transformers' settings (exact GELU is "gelu", an untied head `tie_word_embeddings: false`)."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.context_length,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,
        "activation_function": EXPORTED_ACTIVATION[config.gelu_approximate],
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": config.tie_weights,
        "use_cache": True,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
    }


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def write_hf_tokenizer(tokenizer: Tokenizer, folder: Path, context_length: int) -> str:
    """The tokenizer files transformers reads for GPT-2's tokenizer; for others, our spec beside
    the model. Returns one line saying which."""
    if isinstance(tokenizer, GPT2Tokenizer):
        files = write_gpt2_vocabulary(tokenizer.token_bytes(), folder)
        special = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
        _write_json(
            folder / "tokenizer_config.json",
            {
                "tokenizer_class": "GPT2Tokenizer",
                "model_max_length": context_length,
                "add_prefix_space": False,
            }
            | special,
        )
        _write_json(folder / "special_tokens_map.json", special)
        return f"tokenizer: GPT-2's ({', '.join(files)}), loadable with transformers.AutoTokenizer"
    _write_json(folder / TOKENIZER_SPEC_FILE, tokenizer.spec())
    return (
        f"tokenizer: {tokenizer.name!r} has no Hugging Face equivalent, so transformers gets the model "
        f"alone (it reads and writes token ids); {TOKENIZER_SPEC_FILE} keeps the vocabulary "
        "for minigpt's tools"
    )


def save_huggingface(model: GPT, tokenizer: Tokenizer, folder: str | Path, *, replace: bool = False) -> str:
    """Write `model` as a GPT-2 folder for transformers; all files appear at once (the folder is
    built beside it and renamed). Returns a line about the tokenizer files."""
    folder = Path(folder)
    config = model.config
    missing = gpt2_cannot_compute(config)
    if missing:
        raise CheckpointError(
            f"cannot export to GPT-2's layout: the model uses {', '.join(missing)}, which transformers' "
            "GPT2LMHeadModel does not compute; export it as safetensors instead"
        )
    staging = folder.with_name(f".{folder.name}.partial")  # a killed export's leftovers go first
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        state = to_hf_gpt2(model.state_dict(), config.n_layer, config.tie_weights)
        save_file(
            {k: v.detach().cpu() for k, v in state.items()}, staging / SAFETENSORS_FILE, {"format": "pt"}
        )
        _write_json(
            staging / CONFIG_FILE, hf_config(config, tokenizer.eot_id) | {"dtype": _dtype_name(state)}
        )
        eot = tokenizer.eot_id
        _write_json(staging / "generation_config.json", {"bos_token_id": eot, "eos_token_id": eot})
        note = write_hf_tokenizer(tokenizer, staging, config.context_length)
        if folder.exists():
            if not replace:
                raise CheckpointError(f"{folder} already exists")
            old = folder.with_name(f".{folder.name}.old")
            os.replace(folder, old)
            os.replace(staging, folder)
            shutil.rmtree(old)
        else:
            os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return note


def _dtype_name(state: dict[str, torch.Tensor]) -> str:
    return str(next(iter(state.values())).dtype).removeprefix("torch.")
