"""Choosing a precision the hardware runs natively, falling back instead of emulating."""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger("minigpt")


def _cpu_has_bf16() -> bool:
    """oneDNN's own check (AVX512-BF16 or AMX); assume yes where this PyTorch build cannot tell."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


def resolve_precision(precision: Any) -> Any:
    """Fall back from bf16 where the hardware lacks it: emulated bf16 is slower than fp32."""
    if str(precision).startswith("bf16") and not torch.cuda.is_available():
        if not _cpu_has_bf16():
            log.warning("this CPU has no native bf16; training in fp32 instead of %s", precision)
            return "32-true"
    if str(precision).startswith("bf16") and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        log.warning("this GPU has no bf16; training with fp16 mixed precision instead")
        return "16-mixed"
    return precision
