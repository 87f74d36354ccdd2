"""Choosing the precision the hardware computes fast, falling back instead of emulating: the
model's (`trainer.precision`) and the one Muon orthogonalises in, decided by the same check.

On a CPU the check is oneDNN's word (AVX512-BF16 or AMX) and a measurement: a CPU can report
bf16 and still multiply it slower than fp32 (a virtual machine that does not hand the matrix
units through, say), and there fp32 is both faster and more precise (docs/results/cpu-speed.md).
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import statistics
import time
from typing import Any

import torch

log = logging.getLogger("minigpt")

BF16_GAIN = 1.2
"""How much faster than fp32 a CPU must multiply bf16 for training to take bf16: below it, fp32
costs little or nothing and rounds less."""


def _onednn_bf16() -> bool:
    """oneDNN's own check (AVX512-BF16 or AMX); assume yes where this PyTorch build cannot tell."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


def product_speeds(
    dtypes: tuple[torch.dtype, ...], size: int = 512, rounds: int = 15, pause: float = 0.01
) -> list[float]:
    """Products per second of two (size x size) matrices in each of `dtypes` on this CPU, relative
    to the first dtype's: the median over `rounds` of one product in each, back to back, with a
    `pause` between rounds (a fifth of a second in all). Other work on the machine comes in
    bursts; a burst slows one round's products alike, and the median leaves out the rounds a burst
    began in the middle of."""
    generator = torch.Generator().manual_seed(0)
    pairs = []
    for dtype in dtypes:
        a = torch.randn(size, size, generator=generator).to(dtype)
        b = torch.randn(size, size, generator=generator).to(dtype)
        a @ b  # oneDNN's kernel choice and buffers
        pairs.append((a, b))
    ratios: list[list[float]] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a thread that waits for another one, busy elsewhere, would time that wait
    try:
        for _ in range(rounds):
            seconds = []
            for a, b in pairs:
                start = time.perf_counter()
                a @ b
                seconds.append(time.perf_counter() - start)
            ratios.append([seconds[0] / s for s in seconds])
            time.sleep(pause)
    finally:
        torch.set_num_threads(threads)
    return [statistics.median(r[i] for r in ratios) for i in range(len(dtypes))]


CPU_BF16 = "MINIGPT_CPU_BF16"
"""Environment variable: `1` takes oneDNN's word without measuring (to train in bf16 on a CPU that
multiplies it slowly, or to time it there), `0` never trains a CPU run in bf16."""


@functools.cache
def bf16_gain() -> float:
    """How many times faster this CPU multiplies bf16 matrices than fp32 ones, measured once per
    process; 0 where oneDNN says it has no bf16 (then it emulates it, 10-50x slower). `CPU_BF16`
    overrides the measurement."""
    told = os.environ.get(CPU_BF16, "").strip()
    if told == "0" or not _onednn_bf16():
        return 0.0
    if told == "1":
        return float("inf")
    bf16, fp32 = product_speeds((torch.bfloat16, torch.float32))
    return bf16 / fp32


def _cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 fast enough to train in it (`BF16_GAIN`)."""
    return bf16_gain() >= BF16_GAIN


def has_native_bf16(device: torch.device | str) -> bool:
    """Whether `device` multiplies bf16 matrices natively and fast. A CPU without AVX512-BF16 or AMX
    (AVX2 only: most laptops) emulates bf16 products, 10-50x slower than fp32 ones; one that
    reports them can still be slower in bf16 (`bf16_gain`)."""
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
        log.warning("%s; training in fp32 instead of %s", cpu_bf16_words(), precision)
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
    if has_native_bf16("cpu"):
        return f"{name}, {capability}, native bf16"
    if _onednn_bf16() and bf16_gain() > 0:  # reports bf16, measured slower
        return f"{name}, {capability}, bf16 reported but {bf16_gain():.2f}x fp32's speed"
    return f"{name}, {capability}, no native bf16"


def cpu_bf16_words() -> str:
    """Why this CPU trains in fp32, in a few words."""
    if os.environ.get(CPU_BF16, "").strip() == "0":
        return f"{CPU_BF16}=0"
    if _onednn_bf16():
        return f"this CPU multiplies bf16 at {bf16_gain():.2f}x fp32's speed"
    return "this CPU has no native bf16"
