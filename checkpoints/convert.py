"""Pure state-dict conversions between the layouts model files use and `minigpt.model.GPT`'s.

Functions of tensors only (no files, no Lightning), so each format reader is a file parser plus
one of these, and each conversion can be tested on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

LIGHTNING_PREFIX = "model."
"""LitGPT holds the network as `self.model`, so its state dict keys carry this prefix."""


def from_lightning(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The GPT's own entries of a LightningModule state dict, without the `model.` prefix."""
    n = len(LIGHTNING_PREFIX)
    return {key[n:]: value for key, value in state_dict.items() if key.startswith(LIGHTNING_PREFIX)}


LORA_KEY = "minigpt_lora"
"""Checkpoint key of a LoRA run's adapter settings (`LoRAConfig` as a dict, with `tokens`: the ids
whose rows trained). Its state dict holds each adapted layer as peft wraps it:
`<layer>.base_layer.*`, `<layer>.lora_A.default.weight` (rank, in) and
`<layer>.lora_B.default.weight` (out, rank); and, where tokens' rows trained, each table (the
embedding, the head) as `<table>.token_adapter.base_layer.weight` with the rows in
`<table>.token_adapter.trainable_tokens_delta.default` (tokens, n_embd)."""
LORA_ADAPTER = "default"
"""The name peft gives an adapter when none is chosen, which is part of the adapters' keys."""
TOKEN_ROWS = ".trainable_tokens_delta."
"""What the names of the trained tokens' rows hold, and no other parameter's."""
TOKEN_TABLE = ".token_adapter"
"""What peft puts between a table's name and its frozen `base_layer` when tokens' rows train."""


def merge_lora(
    state: dict[str, torch.Tensor], scale: float, tokens: Sequence[int] = ()
) -> dict[str, torch.Tensor]:
    """`GPT`'s state dict from a LoRA run's: each adapted layer's weight W becomes
    W + scale * B A, the function its adapter computes (peft's `merge`), each table whose
    `tokens` trained takes their rows in place of its own, and the adapters go.

    Written here rather than called through peft, which imports transformers: this package
    imports neither, so generate.py and export.py read a LoRA run as any other.
    """
    merged = {}
    for key, value in state.items():
        layer, wrapped, name = key.partition(".base_layer.")
        if ".lora_A." in key or ".lora_B." in key or TOKEN_ROWS in key:
            continue
        if wrapped and layer.endswith(TOKEN_TABLE):  # a tied head holds the embedding's rows too
            rows = state[f"{layer}{TOKEN_ROWS}{LORA_ADAPTER}"]
            ids = torch.tensor(tokens, dtype=torch.long, device=value.device)
            value = value.index_copy(0, ids, rows.to(value.dtype))
            layer = layer.removesuffix(TOKEN_TABLE)
        elif wrapped and name == "weight":
            a = state[f"{layer}.lora_A.{LORA_ADAPTER}.weight"]
            b = state[f"{layer}.lora_B.{LORA_ADAPTER}.weight"]
            value = value + (scale * (b.float() @ a.float())).to(value.dtype)
        merged[f"{layer}.{name}" if wrapped else key] = value
    return merged


HF_PREFIX = "transformer."
"""`GPT2LMHeadModel` holds the network as `self.transformer`; a bare `GPT2Model` has no prefix."""

HF_BUFFERS = (".attn.bias", ".attn.masked_bias")
"""Causal-mask buffers older versions of transformers saved with the weights; not parameters."""


def hf_gpt2_parameters(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A GPT-2 state dict with `GPT2LMHeadModel`'s keys, whether it was saved from that or from a
    bare `GPT2Model`, and without the mask buffers."""
    return {
        key if key.startswith(HF_PREFIX) or key == "lm_head.weight" else HF_PREFIX + key: value
        for key, value in hf_state.items()
        if not key.endswith(HF_BUFFERS)
    }


def from_hf_gpt2(
    hf_state: dict[str, torch.Tensor], n_layer: int, tie_weights: bool
) -> dict[str, torch.Tensor]:
    """`GPT`'s state dict from GPT-2's in the Hugging Face layout (with biases, as GPT-2 has).

    GPT-2 stores its linear layers as `Conv1D`, whose weight is the transpose of `nn.Linear`'s,
    and its query, key and value projections fused in one `c_attn`; here they are transposed and
    split into `W_query`, `W_key`, `W_value`. A missing entry raises KeyError naming it in GPT-2's
    layout.
    """
    hf = {key.removeprefix(HF_PREFIX): value for key, value in hf_gpt2_parameters(hf_state).items()}
    out = {
        "transformer.wte.weight": hf["wte.weight"],
        "transformer.wpe.weight": hf["wpe.weight"],
        "transformer.ln_f.weight": hf["ln_f.weight"],
        "transformer.ln_f.bias": hf["ln_f.bias"],
        "lm_head.weight": hf["wte.weight"] if tie_weights else hf["lm_head.weight"],
    }
    for i in range(n_layer):
        theirs, ours = f"h.{i}.", f"transformer.h.{i}."
        for name in (
            "ln_1.weight",
            "ln_1.bias",
            "ln_2.weight",
            "ln_2.bias",
            "mlp.c_fc.bias",
            "mlp.c_proj.bias",
        ):
            out[ours + name] = hf[theirs + name]
        query, key, value = hf[theirs + "attn.c_attn.weight"].t().chunk(3)  # each (C, C)
        query_bias, key_bias, value_bias = hf[theirs + "attn.c_attn.bias"].chunk(3)
        out |= {
            ours + "attn.W_query.weight": query,
            ours + "attn.W_key.weight": key,
            ours + "attn.W_value.weight": value,
            ours + "attn.W_query.bias": query_bias,
            ours + "attn.W_key.bias": key_bias,
            ours + "attn.W_value.bias": value_bias,
            ours + "attn.out_proj.weight": hf[theirs + "attn.c_proj.weight"].t(),
            ours + "attn.out_proj.bias": hf[theirs + "attn.c_proj.bias"],
            ours + "mlp.c_fc.weight": hf[theirs + "mlp.c_fc.weight"].t(),
            ours + "mlp.c_proj.weight": hf[theirs + "mlp.c_proj.weight"].t(),
        }
    return {key: value.contiguous() for key, value in out.items()}


def to_hf_gpt2(state: dict[str, torch.Tensor], n_layer: int, tie_weights: bool) -> dict[str, torch.Tensor]:
    """GPT-2's state dict in the Hugging Face layout (`GPT2LMHeadModel`'s keys) from `GPT`'s.

    The inverse of `from_hf_gpt2`. GPT-2 has every bias; a model without some gets zeros there,
    which computes the same function. The head is written only when it is not tied.
    """

    def bias(key: str, size: int, like: torch.Tensor) -> torch.Tensor:
        return state[key] if key in state else torch.zeros(size, dtype=like.dtype, device=like.device)

    wte = state["transformer.wte.weight"]
    n_embd = wte.shape[1]
    out = {
        "wte.weight": wte,
        "wpe.weight": state["transformer.wpe.weight"],
        "ln_f.weight": state["transformer.ln_f.weight"],
        "ln_f.bias": bias("transformer.ln_f.bias", n_embd, wte),
    }
    for i in range(n_layer):
        ours, theirs = f"transformer.h.{i}.", f"h.{i}."
        qkv = [ours + f"attn.W_{name}." for name in ("query", "key", "value")]
        fc = state[ours + "mlp.c_fc.weight"]
        out |= {
            theirs + "ln_1.weight": state[ours + "ln_1.weight"],
            theirs + "ln_1.bias": bias(ours + "ln_1.bias", n_embd, wte),
            theirs + "ln_2.weight": state[ours + "ln_2.weight"],
            theirs + "ln_2.bias": bias(ours + "ln_2.bias", n_embd, wte),
            theirs + "attn.c_attn.weight": torch.cat([state[p + "weight"] for p in qkv]).t(),
            theirs + "attn.c_attn.bias": torch.cat([bias(p + "bias", n_embd, wte) for p in qkv]),
            theirs + "attn.c_proj.weight": state[ours + "attn.out_proj.weight"].t(),
            theirs + "attn.c_proj.bias": bias(ours + "attn.out_proj.bias", n_embd, wte),
            theirs + "mlp.c_fc.weight": fc.t(),
            theirs + "mlp.c_fc.bias": bias(ours + "mlp.c_fc.bias", fc.shape[0], wte),
            theirs + "mlp.c_proj.weight": state[ours + "mlp.c_proj.weight"].t(),
            theirs + "mlp.c_proj.bias": bias(ours + "mlp.c_proj.bias", n_embd, wte),
        }
    out = {HF_PREFIX + key: value.contiguous() for key, value in out.items()}
    if not tie_weights:
        out["lm_head.weight"] = state["lm_head.weight"].contiguous()
    return out
