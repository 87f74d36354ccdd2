"""How much arithmetic a training step is, for MFU (model FLOPs utilisation)."""

from __future__ import annotations

import torch

from minigpt.model import GPTConfig

PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
}
"""Dense bf16/fp16 tensor-core peaks (FLOP/s) of GPUs by a word in their name, from the vendors'
data sheets (SXM parts; PCIe ones are lower, so MFU there reads low). CPUs have no such figure:
pass `peak_flops` to the callback where you know yours."""


def matmul_weights(config: GPTConfig) -> int:
    """Weights that multiply activations: q, k, v, out, fc, proj per block, plus the LM head."""
    if config.vocab_size is None:
        raise ValueError("the model's vocab_size must be known to count its FLOPs")
    return 12 * config.n_layer * config.n_embd**2 + config.vocab_size * config.n_embd


def training_flops_per_token(config: GPTConfig) -> int:
    """Model FLOPs of one training token: 6 per matmul weight, plus attention's QKᵀ and AV.

    A weight costs 2 FLOPs per token forward and twice that backward. Attention scores and their
    weighted sum cost 2 * 2 * T * n_embd per layer per token forward, so 12 * n_layer * n_embd * T
    for forward and backward (PaLM, appendix B). The causal mask's skipped half is counted, as is
    customary; embeddings, LayerNorm, GELU, softmax and the optimizer are not.
    """
    attention = 12 * config.n_layer * config.n_embd * config.context_length
    return 6 * matmul_weights(config) + attention


def known_peak_flops(device: torch.device, precision: str) -> float | None:
    """The dense tensor-core peak of a known GPU under 16-bit mixed precision, else None."""
    if device.type != "cuda" or not str(precision).startswith(("bf16", "16")):
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS.items() if key in name), None)
