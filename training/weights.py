"""The network a run trains and what it writes of it at the end.

- Its vocabulary comes from the data's tokenizer (or `gpt.vocab_size`, never fewer rows).
- `init_from` loads trained weights; a chat fine-tune's tokenizer adds the role markers, whose
  new rows start at the mean of the trained ones (`add_token_rows`).
- Under LoRA every weight but the adapters and those new rows is frozen, and the run's end writes
  the adapters alone in `<run>/adapter/`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from minigpt.checkpoints import CheckpointError, resolve_checkpoint
from minigpt.checkpoints.convert import from_lightning
from minigpt.checkpoints.pickled import load_tensors_only
from minigpt.checkpoints.pretrained import load_pretrained, open_pretrained
from minigpt.model import GPT, ConfigError, GPTConfig
from minigpt.model.vocab import add_token_rows

from .config import LoRAConfig
from .lora import ADAPTER_FOLDER, add_adapters, is_token_rows, save_adapter


def build_network(
    config: GPTConfig,
    tokenizer: Any,
    init_from: str | None,
    lora: LoRAConfig | None,
    started_from: str | None,
) -> tuple[GPT, list[int]]:
    """The GPT a run trains, and the ids the weights it started from had no rows for (the chat
    markers a fine-tune adds: under LoRA their rows train, in the embedding and the head).

    `init_from` is the weights to start from; `started_from` the weights a resumed run started
    from (its hyperparameters' init_from), whose vocabulary a padded table's size cannot tell.
    """
    # A tokenizer that adds the chat markers to the weights' (ChatTokenizer) adds rows too.
    base = getattr(tokenizer, "base", tokenizer)
    vocab_size = config.vocab_size or tokenizer.n_vocab
    if vocab_size < base.n_vocab:
        raise ConfigError(
            f"model vocab_size {vocab_size} is smaller than the tokenizer's {tokenizer.n_vocab} tokens"
        )
    ours = tokenizer.spec()
    model = GPT(replace(config, vocab_size=vocab_size))
    markers = list(range(base.n_vocab, tokenizer.n_vocab))
    new_tokens: list[int] = []
    if init_from is not None:
        model_file, weights, spec = open_pretrained(init_from)
        if spec not in (ours, base.spec()):
            raise ConfigError(
                f"the weights of {init_from} read {spec['name']} token ids, but this run's data is "
                f"tokenized with {ours['name']}"
                + (" (a vocabulary built from other text)" if spec["name"] == tokenizer.name else "")
            )
        load_pretrained(model, model_file, weights)
        if spec != ours:  # the markers are new to the weights
            add_token_rows(model, tokenizer.n_vocab, trained=base.n_vocab)
            new_tokens = markers
    elif vocab_size < tokenizer.n_vocab:  # resuming such a run: its checkpoint holds the rows
        add_token_rows(model, tokenizer.n_vocab, trained=base.n_vocab)
        new_tokens = markers
    elif (
        markers and lora is not None and started_from is not None and open_pretrained(started_from)[2] != ours
    ):
        new_tokens = markers  # resuming, from a table padded past them (GPT-2's 50304 rows)
    if lora is not None:  # last: it freezes what is there, but the new tokens' rows
        add_adapters(model, lora, new_tokens)
    return model, new_tokens


def started_without_markers(started_from: str | None, ours: dict[str, Any]) -> bool:
    """Whether the weights a resumed run started from lacked the chat markers of `ours`."""
    return started_from is not None and open_pretrained(started_from)[2] != ours


def trainable_line(model: GPT, lora: LoRAConfig | None, new_tokens: list[int], params: int) -> str:
    """How many of the `params` parameters train: all of them, or LoRA's adapters and the rows of
    the tokens new to the weights, for the run's summary."""
    if lora is None:  # counted from the shape: under FSDP this rank holds a shard of each
        return f"training: all {params:,} parameters"
    adapters = rows = frozen = 0
    for name, parameter in model.named_parameters():  # tied weights appear once
        if not parameter.requires_grad:
            frozen += parameter.numel()
        elif is_token_rows(name):
            rows += parameter.numel()
        else:
            adapters += parameter.numel()
    trainable = adapters + rows
    total = trainable + frozen
    counts, what = f"{adapters:,}", f"LoRA of rank {lora.rank} on {', '.join(lora.targets)}"
    if rows:
        counts, tokens = counts + f" + {rows:,}", len(new_tokens)
        what += f", and the rows of the {tokens} token{'s' * (tokens != 1)} new to the weights"
    return f"training: {counts} of {total:,} parameters ({trainable / total:.2%}), {what}; the rest frozen"


def write_adapter(model: GPT, run: Path, base: str | None) -> Path:
    """Write a LoRA run's adapters alone: those of the checkpoint that loading the run folder
    reads (its best, else its last), or the model's own where none was saved. `base` is the
    weights the run started from: its hyperparameters' init_from (a resumed run's own is None)."""
    try:
        checkpoint = load_tensors_only(resolve_checkpoint(run), "cannot read the run's checkpoint")
        state: dict[str, torch.Tensor] = from_lightning(checkpoint["state_dict"])
    except CheckpointError:
        state = model.state_dict()
    return save_adapter(model, state, run / ADAPTER_FOLDER, base=base)
