"""Any model of ours as a Hugging Face folder that transformers loads.

A model GPT-2 can compute is written in GPT-2's layout, which `GPT2LMHeadModel` (and so
`AutoModelForCausalLM`) loads with no custom code; any other carries our architecture as custom
code (`hf_remote.py`), loaded with `trust_remote_code=True`. The tokenizer goes beside it: GPT-2's
as its `vocab.json` and `merges.txt`, another as the `tokenizer.json` its
`hf_tokenizer_json()` gives, when it gives one, with our own spec (`minigpt_tokenizer.json`)
from which minigpt rebuilds it exactly. A tokenizer with the chat markers (a fine-tune on
conversations) brings the chat template, and generation stops at the end marker. All files
appear at once: the folder is built beside its place and renamed. Nothing here imports
transformers.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from minigpt.common import reporting_write_failures
from minigpt.data import Tokenizer
from minigpt.data.gpt2_encoding import ENDOFTEXT
from minigpt.data.tokenizer import ChatTokenizer, GPT2Tokenizer
from minigpt.model import GPT, GPTConfig

from .convert import to_hf_gpt2
from .errors import CheckpointError
from .hf_remote import remote_code_config, to_remote_state, write_remote_code
from .hf_tokenizer import chat_settings, write_gpt2_vocabulary
from .huggingface import CONFIG_FILE, SAFETENSORS_FILE, TOKENIZER_JSON, TOKENIZER_SPEC_FILE
from .load import weight_bytes

EXPORTED_ACTIVATION = {"tanh": "gelu_new", "none": "gelu"}
"""transformers' `activation_function` names of the two GELUs our MLP computes."""


def gpt2_cannot_compute(config: GPTConfig) -> list[str]:
    """What of `config` no GPT-2 setting of transformers computes (empty: GPT-2's layout does)."""
    reasons = {
        "rotary position embeddings": config.position_embedding != "learned",
        "normalised queries and keys (qk_norm)": config.qk_norm,
        "RMSNorm": config.norm != "layernorm",
        "the squared-ReLU MLP": config.activation != "gelu",
    }
    return [reason for reason, applies in reasons.items() if applies]


def gpt2_config(config: GPTConfig, eot_id: int | None) -> dict[str, Any]:
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


def generation_config(tokenizer: Tokenizer) -> dict[str, Any]:
    """`generation_config.json`: generation ends at end-of-text and, for a chat model, at the
    end of its turn (first, so transformers pads with it)."""
    eot = tokenizer.eot_id
    if not isinstance(tokenizer, ChatTokenizer):
        return {"bos_token_id": eot, "eos_token_id": eot}
    ends = [tokenizer.end_id] + ([eot] if eot is not None else [])
    return {"bos_token_id": eot, "eos_token_id": ends}


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def write_tokenizer(tokenizer: Tokenizer, folder: Path, context_length: int) -> str:
    """The tokenizer's files for transformers and for us; returns one line saying which."""
    special = {}
    if tokenizer.eot_id is not None:
        special = {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}
    settings = {
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,  # decode gives back the text as it was
        "split_special_tokens": True,  # "<|endoftext|>" in text is text, as in minigpt's tokenizers
    } | special
    if isinstance(tokenizer, GPT2Tokenizer):
        files = write_gpt2_vocabulary(tokenizer.token_bytes(), folder)
        _write_json(
            folder / "tokenizer_config.json",
            {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False} | settings,
        )
        _write_json(folder / "special_tokens_map.json", special)
        return f"tokenizer: GPT-2's ({', '.join(files)}), for transformers.AutoTokenizer"
    _write_json(folder / TOKENIZER_SPEC_FILE, tokenizer.spec())
    hf_json = tokenizer.hf_tokenizer_json() if hasattr(tokenizer, "hf_tokenizer_json") else None
    if hf_json is None:
        return (
            f"tokenizer: {tokenizer.name!r} cannot be written as a Hugging Face tokenizer, so transformers "
            f"gets the model alone (it reads and writes token ids); {TOKENIZER_SPEC_FILE} keeps the "
            "vocabulary for minigpt's tools"
        )
    (folder / TOKENIZER_JSON).write_text(hf_json, encoding="utf-8")
    chat = isinstance(tokenizer, ChatTokenizer)
    if chat:
        settings |= chat_settings(tokenizer)
    _write_json(folder / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast"} | settings)
    if chat:
        return (
            f"tokenizer: {tokenizer.name!r} with the chat markers as {TOKENIZER_JSON}, and the chat "
            "template, for transformers.AutoTokenizer and its apply_chat_template"
        )
    return f"tokenizer: {tokenizer.name!r} as {TOKENIZER_JSON}, for transformers.AutoTokenizer"


def save_huggingface(model: GPT, tokenizer: Tokenizer, folder: str | Path, *, replace: bool = False) -> str:
    """Write `model` and its tokenizer as a folder transformers loads: GPT-2's layout when GPT-2
    computes the model, else our code with it. Returns a line about what was written.

    Raises:
        CheckpointError: `folder` exists and `replace` is false (it is then left as it was).
        WriteError: A full disk or a folder not the user's; `folder` is then as it was.
    """
    folder = Path(folder)
    with reporting_write_failures(folder, size=weight_bytes(model)):
        return _write_folder(model, tokenizer, folder, replace)


def _write_folder(model: GPT, tokenizer: Tokenizer, folder: Path, replace: bool) -> str:
    config = model.config
    staging = folder.with_name(f".{folder.name}.partial")  # a killed export's leftovers go first
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        custom = gpt2_cannot_compute(config)
        if custom:
            state = to_remote_state(model.state_dict(), config.tie_weights)
            hf_config = remote_code_config(config, tokenizer.eot_id)
            write_remote_code(staging)
            layout = f"minigpt's architecture as custom code ({', '.join(custom)}: not GPT-2's)"
        else:
            state = to_hf_gpt2(model.state_dict(), config.n_layer, config.tie_weights)
            hf_config = gpt2_config(config, tokenizer.eot_id)
            layout = "GPT-2's layout, no custom code"
        state = {key: value.detach().cpu().contiguous() for key, value in state.items()}
        save_file(state, staging / SAFETENSORS_FILE, {"format": "pt"})
        _write_json(staging / CONFIG_FILE, hf_config | {"dtype": _dtype_name(state)})
        _write_json(staging / "generation_config.json", generation_config(tokenizer))
        note = write_tokenizer(tokenizer, staging, config.context_length)
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
    return f"model: {layout}\n{note}"


def _dtype_name(state: dict[str, torch.Tensor]) -> str:
    return str(next(iter(state.values())).dtype).removeprefix("torch.")
