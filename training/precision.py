"""Choosing the precision the hardware computes fast, falling back instead of emulating: the
model's (`trainer.precision`) and the one Muon orthogonalises in, decided by the same check."""

from __future__ import annotations

import logging
import platform
from typing import Any

import torch

log = logging.getLogger("minigpt")


def _cpu_has_bf16() -> bool:
    """oneDNN's own check (AVX512-BF16 or AMX); assume yes where this PyTorch build cannot tell."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


def has_native_bf16(device: torch.device | str) -> bool:
    """Whether `device` multiplies bf16 matrices natively. A CPU without AVX512-BF16 or AMX (AVX2
    only: most laptops) emulates bf16 products, 10-50x slower than fp32 ones."""
    kind = torch.device(device).type
    if kind == "cpu":
        return _cpu_has_bf16()
    if kind == "cuda":
        return torch.cuda.is_bf16_supported()
    return True  # other accelerators: as torch assumes


def fast_matmul_dtype(device: torch.device | str) -> torch.dtype:
    """bf16 where `device` multiplies it natively, fp32 elsewhere."""
    return torch.bfloat16 if has_native_bf16(device) else torch.float32


def training_device(accelerator: Any) -> str:
    """The kind of device a trainer given `accelerator` computes on: "cpu" or "cuda" (Lightning's
    `auto` takes a GPU where there is one), or the name of another accelerator."""
    name = str(accelerator if isinstance(accelerator, str) else type(accelerator).__name__).lower()
    if name in ("auto", "none"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name in ("gpu", "cuda") or name.startswith("cuda"):
        return "cuda"
    return "cpu" if name.startswith("cpu") else name


def resolve_precision(precision: Any, accelerator: Any = "auto") -> Any:
    """Fall back from bf16 where the device the run trains on lacks it: emulated bf16 is slower
    than fp32. `accelerator` is the trainer's, so a run kept on the CPU of a machine with a GPU is
    decided by its CPU."""
    if not str(precision).startswith("bf16"):
        return precision
    device = training_device(accelerator)
    if device == "cpu" and not has_native_bf16("cpu"):
        log.warning("this CPU has no native bf16; training in fp32 instead of %s", precision)
        return "32-true"
    if device == "cuda" and not has_native_bf16("cuda"):
        log.warning("this GPU has no bf16; training with fp16 mixed precision instead")
        return "16-mixed"
    return precision


def cpu_description() -> str:
    """This CPU's name and what decides its speed here, e.g. "AMD EPYC (family 25 model 1), AVX2,
    no native bf16": figures taken on one kind of CPU do not carry over to the other."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
                if not line.strip():
                    break  # the first processor's block is enough
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{name}, {capability}, {'native' if has_native_bf16('cpu') else 'no native'} bf16"
