"""Typed configuration of the GPT architecture."""

from __future__ import annotations

from dataclasses import dataclass

ATTENTION_PATHS = ("auto", "sdpa", "explicit")
"""Values of the `attention` setting: SDPA on GPUs and explicit on CPU (but for one-token steps),
always SDPA, always explicit."""
GELU_APPROXIMATIONS = ("none", "tanh")
POSITION_EMBEDDINGS = ("learned", "rope")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "relu2")


class ConfigError(ValueError):
    """A configuration value a user set is invalid; the message is one line naming it."""


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a decoder-only GPT. The defaults are a small model that trains on a laptop CPU."""

    vocab_size: int | None = None
    """Token embedding rows. None: the tokenizer's size; a larger value pads the table (e.g. 50304)."""
    context_length: int = 128
    """Longest sequence the model attends over (GPT-2: 1024)."""
    n_layer: int = 4
    """Number of transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide n_embd."""
    n_embd: int = 256
    """Width of the residual stream."""
    dropout: float = 0.0
    """Dropout on embeddings, attention weights and residual branches (0 for small data or short runs)."""
    qkv_bias: bool = False
    """Add a bias to the query/key/value projections (GPT-2 has one)."""
    bias: bool = True
    """Bias in LayerNorms, MLP and output projections, as in GPT-2."""
    tie_weights: bool = True
    """Share the token embedding with the output head (GPT-2 does; saves vocab x n_embd parameters)."""
    layer_norm_eps: float = 1e-5
    """The LayerNorms' epsilon (GPT-2's `layer_norm_epsilon`: 1e-5)."""
    gelu_approximate: str = "none"
    """The MLP's GELU: "none" computes it exactly (with erf, as nanoGPT does), "tanh" with GPT-2's
    approximation, for GPT-2's own weights. The two differ by under 1e-3; on CPU the exact one is
    the faster of the two (benchmarks/RESULTS.md)."""
    position_embedding: str = "learned"
    """"learned": GPT-2's table of position vectors added to the token embeddings; "rope": rotary
    embeddings that rotate each head's queries and keys by their position (no table)."""
    rope_base: float = 10000.0
    """rope only: the base of the rotation frequencies."""
    qk_norm: bool = False
    """Normalise each head's queries and keys (RMS, no gain) before their dot product, which keeps
    attention logits bounded at high learning rates."""
    norm: str = "layernorm"
    """The blocks' and final normalisation: "layernorm" (GPT-2) or "rmsnorm" (no centring, no bias)."""
    activation: str = "gelu"
    """The MLP's nonlinearity: "gelu" (GPT-2; see gelu_approximate) or "relu2", the squared ReLU."""
    zero_init_proj: bool = False
    """Start the blocks' output projections (attention and MLP) at zero, so each block begins as
    the identity, instead of GPT-2's scaled normal init."""
    attention: str = "auto"
    """How attention is computed: "sdpa" (PyTorch's fused kernels), "explicit" (the textbook
    matmul-mask-softmax-matmul) or "auto" (SDPA on GPUs; explicit on CPU, where it trains faster,
    except for one-token decoding steps). Same results either way, so it may change between a run
    and its resume."""

    def __post_init__(self) -> None:
        for name in ("context_length", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model {name} must be at least 1, got {getattr(self, name)}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ConfigError(f"model vocab_size must be at least 1, got {self.vocab_size}")
        if self.n_embd % self.n_head:
            raise ConfigError(f"model n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.attention not in ATTENTION_PATHS:
            raise ConfigError(
                f"model attention must be one of {', '.join(ATTENTION_PATHS)}, got {self.attention!r}"
            )
        if self.gelu_approximate not in GELU_APPROXIMATIONS:
            raise ConfigError(
                f"model gelu_approximate must be one of {', '.join(GELU_APPROXIMATIONS)}, "
                f"got {self.gelu_approximate!r}"
            )
        if not self.layer_norm_eps > 0:
            raise ConfigError(f"model layer_norm_eps must be positive, got {self.layer_norm_eps}")
        for name, allowed in (
            ("position_embedding", POSITION_EMBEDDINGS),
            ("norm", NORMS),
            ("activation", ACTIVATIONS),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"model {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        if self.position_embedding == "rope" and self.head_size % 2:
            raise ConfigError(f"model position_embedding rope needs an even head size, got {self.head_size}")
        if self.rope_base <= 1:
            raise ConfigError(f"model rope_base must be > 1, got {self.rope_base}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model dropout must be in [0, 1), got {self.dropout}")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head


def parameter_count(config: GPTConfig) -> int:
    """Parameters of `GPT(config)` (tied embeddings counted once), without building it."""
    c, bias = config.n_embd, int(config.bias)
    layer_norm = c * (1 + (bias if config.norm == "layernorm" else 0))
    attention = 4 * c * c + 3 * c * int(config.qkv_bias) + c * bias
    mlp = 8 * c * c + 5 * c * bias
    block = 2 * layer_norm + attention + mlp
    positions = config.context_length if config.position_embedding == "learned" else 0
    embeddings = (config.vocab_size + positions) * c
    head = 0 if config.tie_weights else config.vocab_size * c
    return embeddings + config.n_layer * block + layer_norm + head
