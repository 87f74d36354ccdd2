"""Plain-PyTorch GPT: attention, blocks, the model, sampling and generation. Imports only torch."""

from .attention import MultiHeadAttention
from .config import ConfigError, GPTConfig
from .generation import LastTokenHead, generate, generate_steps, generate_tokens, optimize_for_decoding
from .gpt import GPT, MLP, Block
from .kv_cache import KVCache
from .sampling import check_sampling, sample_next, top_k_filter, top_p_filter
from .vocab import add_token_rows

__all__ = [
    "GPT",
    "MLP",
    "Block",
    "ConfigError",
    "GPTConfig",
    "KVCache",
    "LastTokenHead",
    "MultiHeadAttention",
    "add_token_rows",
    "check_sampling",
    "generate",
    "generate_steps",
    "generate_tokens",
    "optimize_for_decoding",
    "sample_next",
    "top_k_filter",
    "top_p_filter",
]
