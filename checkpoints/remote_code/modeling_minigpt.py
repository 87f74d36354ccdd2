"""minigpt's GPT as a transformers causal LM (custom code, loaded with trust_remote_code).

The network is minigpt's own `GPT` (minigpt_gpt.py and the modules beside it, copied from minigpt's
model/ package at export), so it computes what the model computed in minigpt. This file adapts it
to transformers: `MiniGPTForCausalLM` takes `input_ids` and returns `CausalLMOutputWithPast`,
keeps keys and values in transformers' own cache (any `Cache`, e.g. `DynamicCache`), so
`generate()` works with or without it, and computes the loss from `labels` when given.

The model attends over the whole sequence: an `attention_mask` that masks out any token (a padded
batch) is refused rather than ignored. Depends on torch and transformers only.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_minigpt import MiniGPTConfig
from .minigpt_gpt import GPT
from .minigpt_mask import causal_mask
from .minigpt_rotary import RotaryEmbedding

CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
"""What the output calls the cache: `cache` from transformers 5.24 on, `past_key_values` before."""


class LayerCache:
    """One layer of a transformers `Cache`, as minigpt's attention uses a cache: `length` and
    `append(keys, values)` returning every key and value so far, each (B, n_head, T, head size)."""

    def __init__(self, cache: Cache, layer: int) -> None:
        self.cache, self.layer = cache, layer

    @property
    def length(self) -> int:
        return self.cache.get_seq_length(self.layer)

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(keys, values, self.layer)


class MiniGPTPreTrainedModel(PreTrainedModel):
    config_class = MiniGPTConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["Block"]

    def _init_weights(self, module: torch.nn.Module) -> None:
        if isinstance(module, torch.nn.Linear | torch.nn.Embedding):
            GPT._init_weights(module)

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> MiniGPTPreTrainedModel:
        """transformers' loading, then the tables that are not saved (the rotations and the causal
        mask) computed again: transformers builds the model on the "meta" device, which leaves them
        without values, and never calls their code again."""
        model = super().from_pretrained(*args, **kwargs)
        model.restore_tables()
        return model

    def restore_tables(self) -> None:
        """Rebuild the rotary tables and causal masks of every block, beside the weights."""
        gpt = self.model
        device = gpt.lm_head.weight.device
        c = gpt.config
        rotary = None
        if c.position_embedding == "rope":
            rotary = RotaryEmbedding(c.head_size, c.context_length, c.rope_base).to(device)
        for block in gpt.transformer.h:
            block.attn.mask = causal_mask(c.context_length, device)
            if rotary is not None:
                block.attn.rotary = rotary  # one table for every layer, as minigpt's GPT has


class MiniGPTForCausalLM(MiniGPTPreTrainedModel, GenerationMixin):
    """Token ids (B, T) in, next-token logits (B, T, vocab_size) out, as minigpt's GPT."""

    def __init__(self, config: MiniGPTConfig) -> None:
        super().__init__(config)
        self.model = GPT(config.gpt_config())
        # minigpt ties the head to the token embeddings when the config says so; transformers
        # needs to know, to tie them again after loading a file that stores them once.
        if config.tie_weights:
            self._tied_weights_keys = {"model.lm_head.weight": "model.transformer.wte.weight"}
        self.post_init()

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.transformer.wte

    def set_input_embeddings(self, value: torch.nn.Embedding) -> None:
        self.model.transformer.wte = value

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.model.lm_head

    def set_output_embeddings(self, value: torch.nn.Linear) -> None:
        self.model.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        labels: torch.LongTensor | None = None,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """`logits_to_keep` > 0: the logits of that many last positions only (what generation asks).
        The cache comes as `cache` (transformers 5) or `past_key_values` (earlier versions)."""
        cache = kwargs.pop("past_key_values", None) if cache is None else cache
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError(
                "minigpt models attend over every token: pass sequences of one length without padding "
                "(attention_mask all ones)"
            )
        vocab_size = self.model.config.vocab_size
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size):
            bad = input_ids[(input_ids < 0) | (input_ids >= vocab_size)][0]
            raise ValueError(f"token id {int(bad)} is outside this model's vocabulary of {vocab_size} ids")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache()
        caches = [LayerCache(cache, i) for i in range(self.model.config.n_layer)] if use_cache else None
        hidden = self.model.features(input_ids, caches)  # (B, T, n_embd)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.model.lm_head(hidden)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache if use_cache else None})
