"""The causal mask: one tensor per context length and device, shared by every attention layer;
and the mask that keeps sequences packed into one row apart (`segment_mask`).

A 12-layer model at context 8,192 holds one 64 MB mask rather than twelve. A context length whose
mask cannot fit in the machine's memory is refused with a `ConfigError` naming the setting, before
anything is allocated.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .device import check_fits

_MASKS: weakref.WeakValueDictionary[tuple[int, torch.device], torch.Tensor] = weakref.WeakValueDictionary()
"""The causal masks alive in some model, by size and device."""


def causal_mask(size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The (size, size) boolean mask, True above the diagonal ("may not look here").

    Every caller asking for the same size on the same device gets the same tensor, for as long
    as one of them holds it. Built on `device` (default: PyTorch's default device).

    Raises:
        ConfigError: the mask is larger than the device's memory (a context length too long).
    """
    device = torch.device(device) if device is not None else torch.get_default_device()
    mask = _MASKS.get((size, device))
    if mask is None:
        check_fits(size * size, device, f"model context_length {size}: its {size} x {size} attention mask")
        mask = torch.ones(size, size, dtype=torch.bool, device=device).triu_(diagonal=1)
        _MASKS[(size, device)] = mask
    return mask


@contextmanager
def mask_kept_shared(module: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Around `module._apply(fn)`: its `mask` buffer is left out of the conversion, then replaced by
    the shared `causal_mask` of the device `fn` moves tensors to.

    `model.to(device)` converts each module's buffers on its own, which would give every layer a
    copy of the mask. This is the one place the model reaches into `nn.Module`'s `_buffers`.
    """
    mask = module._buffers.pop("mask")
    try:
        yield
    finally:
        module._buffers["mask"] = mask
    module._buffers["mask"] = causal_mask(mask.shape[0], fn(mask[:0, :0]).device)


def segment_mask(segments: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool, True where query i and key j of a row share a segment id in `segments`
    (B, T): the sequences packed into one row, which attend each to itself alone. It broadcasts
    over the heads; attention adds its causal mask."""
    return (segments[:, :, None] == segments[:, None, :]).unsqueeze(1)
