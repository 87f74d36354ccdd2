#!/usr/bin/env python
"""minigpt performance benchmark: matmul peak, training throughput and MFU, Lightning overhead,
generation speed and data preparation, against the reference GPT of "Build a Large Language Model
(From Scratch)" (the ``llms-from-scratch`` package) where it has a counterpart.

CPU speed on shared or virtual machines drifts, sometimes within seconds. So every section
*interleaves* its contestants: each repeat runs one timed block of every contestant (the order
rotates between repeats), and tables show medians over the repeats. Speed-ups are the median of
the per-repeat ratios, which cancels most of the drift. Each training block is preceded by a
short matmul probe in the same precision and thread count; MFU is measured against that probe.

Run ``python benchmarks/bench.py --help`` for the options; ``--quick`` is a one-minute smoke run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import datetime
import gc
import importlib.metadata
import json
import logging
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minigpt.model import GPT, GPTConfig, MultiHeadAttention, generate, optimize_for_decoding
from minigpt.training import allocator
from minigpt.training.config import OptimConfig
from minigpt.training.loss import fused_linear_cross_entropy, next_token_loss
from minigpt.training.optim import build_optimizer

SECTIONS = ("data", "matmul", "train", "alloc", "bound", "compile", "lightning", "generate")
"""Run order. data goes first: datasets.map forks worker processes, and forking a process that
already holds gigabytes of models is slower than the fresh train.py process a user prepares in."""
"""alloc also covers thread counts, in the same interleaved grid."""
PEER_PACKAGE = "llms-from-scratch"
PEER_INSTALL = "pip install --no-deps llms-from-scratch"
WORKER_MARK = "@@bench "

OPTIM = OptimConfig(lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.95)
"""AdamW settings shared by every contestant (ours through build_optimizer, the peer directly)."""


QUIET = False
"""Set in worker processes, whose progress the parent reports."""


def log(message: str) -> None:
    """Progress goes to stderr so stdout holds only the report."""
    if not QUIET:
        print(message, file=sys.stderr, flush=True)


def now() -> float:
    return time.perf_counter()


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# -- shapes and FLOPs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    name: str
    vocab: int
    context: int
    n_layer: int
    n_head: int
    n_embd: int
    batch: int

    def batch_size(self, batch_div: int) -> int:
        """The batch a run with `--batch-div` uses (--quick divides it)."""
        return max(1, self.batch // batch_div)

    def gpt_config(self, context: int | None = None, attention: str = "auto") -> GPTConfig:
        return GPTConfig(
            vocab_size=self.vocab,
            context_length=context or self.context,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd=self.n_embd,
            dropout=0.0,
            attention=attention,
        )

    def peer_config(self, context: int | None = None) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab,
            "context_length": context or self.context,
            "emb_dim": self.n_embd,
            "n_heads": self.n_head,
            "n_layers": self.n_layer,
            "drop_rate": 0.0,
            "qkv_bias": False,
        }

    def matmul_params(self) -> int:
        """Weights that multiply activations: q, k, v, out, fc, proj per block, plus the LM head."""
        return 12 * self.n_layer * self.n_embd**2 + self.vocab * self.n_embd

    def flops_per_token(self) -> int:
        """Training FLOPs per token: 6 per matmul weight plus attention's QK^T and AV.

        Forward costs 2 FLOPs per weight per token; backward costs twice the forward. Attention
        scores and their weighted sum cost 2 * 2 * T * n_embd per layer per token forward, so
        12 * n_layer * n_embd * T for a training step (PaLM appendix B; nanoGPT estimate_mfu,
        which uses all parameters instead of the matmul ones). The causal mask's skipped half
        is counted, as is customary. Embedding lookups, LayerNorm, GELU, softmax and the
        optimizer are not counted.
        """
        return 6 * self.matmul_params() + 12 * self.n_layer * self.n_embd * self.context


SHAPES = {
    "small": Shape("small", vocab=50257, context=128, n_layer=4, n_head=4, n_embd=256, batch=16),
    "char": Shape("char", vocab=65, context=256, n_layer=6, n_head=6, n_embd=384, batch=8),
}


def linear_weights(model: nn.Module) -> int:
    """Elements of all nn.Linear weights (a tied LM head counts once, as a matmul)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


# -- the peer ---------------------------------------------------------------------------------

_PEER: Any = None
_PEER_ERROR: str | None = None


def load_peer() -> Any:
    """The peer's ch04 module, or None (with a message on stderr the first time) if not installed."""
    global _PEER, _PEER_ERROR
    if _PEER is None and _PEER_ERROR is None:
        try:
            from llms_from_scratch import ch04

            _PEER = ch04
        except ImportError as error:
            _PEER_ERROR = f"{PEER_PACKAGE} is not installed ({error}); install it with: {PEER_INSTALL}"
            log(f"NOTE: {_PEER_ERROR}. Its rows are skipped.")
    return _PEER


def peer_version() -> str:
    try:
        return importlib.metadata.version(PEER_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# -- statistics -------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def paired_ratio(a: dict[int, float], b: dict[int, float]) -> float:
    """Median over repeats of a[r] / b[r], using only repeats where both were measured."""
    return median([a[r] / b[r] for r in a if r in b and b[r] > 0])


def fmt(value: float, digits: int = 0) -> str:
    if value != value:  # NaN
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_range(values: list[float], digits: int = 0) -> str:
    return f"{fmt(min(values), digits)}–{fmt(max(values), digits)}" if values else "n/a"


def rotated(items: list, r: int) -> list:
    if not items:
        return items
    k = r % len(items)
    return items[k:] + items[:k]


DEFAULT_THREADS = 0
"""Thread count of contestants that do not set their own (0: leave torch's as it is)."""


def use_threads(n: int | None = None) -> bool:
    """Switch torch to `n` threads (None: DEFAULT_THREADS); True if the count changed."""
    want = n or DEFAULT_THREADS or torch.get_num_threads()
    if torch.get_num_threads() == want:
        return False
    torch.set_num_threads(want)
    return True


class LoadMeter:
    """CPU time used by other processes and stolen by the hypervisor while a section ran.

    On a shared machine another busy process makes multi-threaded kernels wait for a thread that
    is not running, so this is printed under every section to tell such runs apart.
    """

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, list[int], float] | None:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
        except (OSError, ValueError, IndexError):
            return None
        t = os.times()
        return now(), fields, t.user + t.system + t.children_user + t.children_system

    def summary(self) -> str:
        end = self._sample()
        if self.start is None or end is None:
            return ""
        wall = end[0] - self.start[0]
        d = [b - a for a, b in zip(self.start[1], end[1], strict=True)]
        tick = os.sysconf("SC_CLK_TCK")
        user, nice, system, _idle, _iowait, irq, softirq, steal = d
        busy = (user + nice + system + irq + softirq) / tick
        other = max(0.0, busy - (end[2] - self.start[2])) / wall
        return (
            f"_Machine during this section ({wall:.0f} s): other processes used {other:.2f} cores on "
            f"average, hypervisor steal {steal / tick / wall:.2f} cores._"
        )


# -- matmul peak ------------------------------------------------------------------------------

MATMUL_SHAPES = {"2048x2048 @ 2048x2048": (2048, 2048, 2048), "2048x256 @ 256x50257": (2048, 256, 50257)}
PROBE_SHAPE = "2048x2048 @ 2048x2048"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Matmul:
    """Matmul throughput probes; every measurement is kept for the peak table."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str, int], list[float]] = {}
        self._inputs: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def _operands(self, shape: str, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
        key = (shape, dtype)
        if key not in self._inputs:
            m, k, n = MATMUL_SHAPES[shape]
            g = torch.Generator().manual_seed(0)
            a = torch.randn(m, k, generator=g).to(DTYPES[dtype])
            b = torch.randn(k, n, generator=g).to(DTYPES[dtype])
            a @ b  # first call pays one-time setup
            self._inputs[key] = (a, b)
        return self._inputs[key]

    def measure(self, shape: str, dtype: str, calls: int = 1) -> float:
        """GFLOP/s of `a @ b` (a fresh output each call, as in a model), best of `calls`."""
        a, b = self._operands(shape, dtype)
        m, k, n = MATMUL_SHAPES[shape]
        best = float("inf")
        for _ in range(calls):
            start = now()
            c = a @ b
            best = min(best, now() - start)
            del c
        gflops = 2 * m * k * n / best / 1e9
        self.samples.setdefault((shape, dtype, torch.get_num_threads()), []).append(gflops)
        return gflops

    def probe(self, dtype: str) -> float:
        """The peak used for MFU: best of 3 square matmuls, right before a timed block."""
        return self.measure(PROBE_SHAPE, dtype, calls=3)

    def round(self) -> None:
        for shape in MATMUL_SHAPES:
            for dtype in DTYPES:
                self.measure(shape, dtype)


# -- training contestants -------------------------------------------------------------------


@dataclass(frozen=True)
class TrainSpec:
    shape: str
    impl: str
    """"ours", "peer" (ch04.GPTModel) or "peer-fast" (ch04.GPTModelFast)."""
    bf16: bool
    loss: str = "full"
    """"full": cross-entropy of the whole logits tensor; "fused": fused_linear_cross_entropy."""
    chunk: int = 0
    adamw: str = "fused"
    """"fused": AdamW(fused=True); "default": AdamW's default on CPU (a per-tensor for-loop)."""
    compile: bool = False
    threads: int | None = None
    attention: str = "auto"
    """Ours only: the model's `attention` setting ("auto" is the explicit path on CPU)."""
    skip_elementwise: bool = False
    """Ours only, a measurement rather than a model: softmax, GELU and LayerNorm removed (see
    `remove_elementwise`), to show how fast the step could be if they cost nothing."""

    @property
    def dtype(self) -> str:
        return "bf16" if self.bf16 else "fp32"

    @property
    def name(self) -> str:
        model = {"ours": "ours", "peer": "peer GPTModel", "peer-fast": "peer GPTModelFast"}[self.impl]
        parts = [f"{model} {'bf16 autocast' if self.bf16 else 'fp32'}"]
        if self.impl == "ours":
            parts.append(f"fused CE {self.chunk}" if self.loss == "fused" else "full-logits CE")
        parts.append("AdamW fused" if self.adamw == "fused" else "AdamW default")
        if self.attention != "auto":
            parts.append(f"{self.attention} attention")
        if self.skip_elementwise:
            parts.append("WITHOUT softmax, GELU, LayerNorm (not a model)")
        if self.compile:
            parts.append("torch.compile")
        if self.threads is not None:
            parts.append(f"{self.threads} thread{'s' if self.threads > 1 else ''}")
        return ", ".join(parts)


def _attention_without_softmax(
    self: Any, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int
) -> tuple[torch.Tensor, None]:
    b, h, t, hs = queries.shape
    scores = torch.bmm(queries.reshape(b * h, t, hs), keys.reshape(b * h, t, hs).transpose(1, 2))
    return scores.view(b, h, t, t) @ values, None


def remove_elementwise(model: GPT) -> None:
    """Turn `model` into a measuring device: every LayerNorm and GELU becomes the identity, and
    attention multiplies Q K^T straight into V (no scale, mask, softmax or fp32 casts). It keeps
    every matrix product, the embeddings, the loss and the optimizer, so its speed is what a
    step could reach if those elementwise operations cost nothing."""
    for name, module in list(model.named_modules()):
        if isinstance(module, (nn.LayerNorm, nn.GELU)):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, nn.Identity())
        elif isinstance(module, MultiHeadAttention):
            module._explicit_attention = types.MethodType(_attention_without_softmax, module)


def build_train_step(spec: TrainSpec, batch_div: int) -> tuple[Callable[[], torch.Tensor], int, int]:
    """One optimizer step (forward, loss, backward, AdamW step, zero_grad) on a fixed random batch.

    Returns the step function, tokens per step and model FLOPs per step.
    """
    shape = SHAPES[spec.shape]
    batch = shape.batch_size(batch_div)
    g = torch.Generator().manual_seed(1234)
    x = torch.randint(shape.vocab, (batch, shape.context), generator=g)
    y = torch.randint(shape.vocab, (batch, shape.context), generator=g)
    torch.manual_seed(0)
    fused_adamw = spec.adamw == "fused"
    if spec.impl == "ours":
        model: nn.Module = GPT(shape.gpt_config(attention=spec.attention))
        if spec.skip_elementwise:
            remove_elementwise(model)
        optimizer = build_optimizer(model, OptimConfig(**{**asdict(OPTIM), "fused": fused_adamw}))
    else:
        peer = load_peer()
        if peer is None:
            raise RuntimeError(f"{PEER_PACKAGE} is not installed ({PEER_INSTALL})")
        cls = peer.GPTModel if spec.impl == "peer" else peer.GPTModelFast
        model = cls(shape.peer_config())
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=OPTIM.lr,
            betas=(OPTIM.beta1, OPTIM.beta2),
            weight_decay=OPTIM.weight_decay,
            fused=True if fused_adamw else None,
        )
    model.train()
    if linear_weights(model) != shape.matmul_params():
        raise RuntimeError(f"{spec.name}: matmul weights {linear_weights(model)} != {shape.matmul_params()}")
    flops = shape.flops_per_token() * batch * shape.context

    if spec.impl == "ours":
        features = torch.compile(model.features) if spec.compile else model.features
        head = model.lm_head

        def loss_fn() -> torch.Tensor:
            hidden = features(x)
            if spec.loss == "fused":
                return fused_linear_cross_entropy(hidden, head.weight, y, spec.chunk)
            return next_token_loss(head(hidden), y)

    else:
        forward = torch.compile(model) if spec.compile else model

        def loss_fn() -> torch.Tensor:
            return F.cross_entropy(forward(x).flatten(0, 1), y.flatten())

    def step() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.bf16):
            loss = loss_fn()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step, batch * shape.context, flops


@dataclass
class TrainEntry:
    """A training contestant and its measurements, keyed by repeat."""

    spec: TrainSpec
    label: str = ""
    step: Callable[[], torch.Tensor] | None = None
    tokens: int = 0
    flops: int = 0
    first_step_s: float = float("nan")
    error: str | None = None
    tps: dict[int, float] = field(default_factory=dict)
    mfu: dict[int, float] = field(default_factory=dict)
    faults: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.label = self.label or self.spec.name

    def prepare(self, warmup: int, batch_div: int) -> None:
        try:
            use_threads(self.spec.threads)
            self.step, self.tokens, self.flops = build_train_step(self.spec, batch_div)
            for i in range(max(1, warmup)):
                start = now()
                loss = float(self.step())
                if i == 0:
                    self.first_step_s = now() - start
                if not loss == loss or loss in (float("inf"), float("-inf")):
                    raise RuntimeError(f"loss is {loss}")
        except Exception as error:  # report, keep benchmarking the others
            self.error = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
            self.step = None
            log(f"  FAILED {self.label}: {self.error}")

    def measure(self, r: int, steps: int, matmul: Matmul) -> None:
        if self.step is None:
            return
        if use_threads(self.spec.threads):
            self.step()  # the first step after a thread-count switch pays for new threads and kernels
        peak = matmul.probe(self.spec.dtype)
        faults = minor_faults()
        start = now()
        for _ in range(steps):
            self.step()
        seconds = now() - start
        faults = minor_faults() - faults
        self.tps[r] = self.tokens * steps / seconds
        self.mfu[r] = self.flops * steps / seconds / (peak * 1e9)
        self.faults[r] = faults / steps
        log(f"  [{r}] {self.label}: {self.tps[r]:,.0f} tok/s, MFU {100 * self.mfu[r]:.1f}%")

    def release(self) -> None:
        self.step = None


def run_interleaved(
    entries: list,
    repeats: int,
    steps: int,
    warmup: int,
    batch_div: int,
    matmul: Matmul,
    title: str,
    each_round: Callable[[int], None] | None = None,
) -> None:
    """Prepare every entry, then `repeats` rounds of one timed block per entry in rotating order.

    Each round starts with a matmul round and `each_round(r)`, if given.
    """
    log(f"[{title}] building and warming up {len(entries)} contestants")
    for entry in entries:
        entry.prepare(warmup, batch_div)
    for r in range(repeats):
        log(f"[{title}] repeat {r + 1}/{repeats}")
        matmul.round()
        if each_round is not None:
            each_round(r)
        for entry in rotated(entries, r):
            entry.measure(r, steps, matmul)


def train_rows(entries: list[TrainEntry], baseline: TrainEntry | None) -> list[list[str]]:
    rows = []
    for e in entries:
        if e.error:
            rows.append([e.label, "failed", "", "", "", "", e.error])
            continue
        tps = list(e.tps.values())
        ratio = paired_ratio(e.tps, baseline.tps) if baseline and baseline.tps else float("nan")
        rows.append(
            [
                e.label,
                fmt(median(tps)),
                fmt_range(tps),
                fmt(100 * median(list(e.mfu.values())), 1),
                f"{fmt(ratio, 2)}x",
                fmt(median(list(e.faults.values()))),
                "",
            ]
        )
    return rows


TRAIN_HEADERS = ["contestant", "tokens/s", "range", "MFU %", "speed-up", "page faults/step", "note"]


# -- report ---------------------------------------------------------------------------------


class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, text: str = "") -> None:
        self.lines.append(text)
        print(text, flush=True)

    def table(self, headers: list[str], rows: list[list[str]]) -> None:
        self.add("| " + " | ".join(headers) + " |")
        self.add("|" + "|".join("---" for _ in headers) + "|")
        for row in rows:
            self.add("| " + " | ".join(str(c) for c in row) + " |")
        self.add()

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                keep = [f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")]
                return " ".join(keep) or "none of avx2/avx512/amx"
    return "unknown"


# -- sections -------------------------------------------------------------------------------


@dataclass
class State:
    args: argparse.Namespace
    report: Report
    matmul: Matmul
    best_chunk: int = 256
    bound: MatmulBound = field(default_factory=lambda: MatmulBound())
    fastest: dict[str, tuple[str, str, dict[int, float]]] = field(default_factory=dict)
    """The fastest contestant of each kind ("ours", "peer") per shape and measurement, as (label,
    the section whose bound rounds it pairs with, tokens/s per repeat)."""


def section_matmul_rounds(state: State) -> None:
    """Standalone probe rounds when the training section does not run (it interleaves its own)."""
    log("[matmul] measuring")
    for r in range(state.args.repeats):
        log(f"[matmul] repeat {r + 1}/{state.args.repeats}")
        state.matmul.round()
        for dtype in DTYPES:
            state.matmul.probe(dtype)


def report_matmul(state: State) -> None:
    rep = state.report
    rep.add("## 1. Matmul throughput")
    rep.add()
    rep.add(
        "GFLOP/s of `a @ b` (new output tensor each call), every measurement taken during this run: "
        "one round per training repeat plus the best-of-3 probe taken right before every timed "
        f"training block. The probe shape ({PROBE_SHAPE}) is the peak that MFU is measured against, "
        "in the block's own precision and thread count."
    )
    rep.add()
    rows = []
    for (shape, dtype, threads), values in sorted(state.matmul.samples.items()):
        rows.append([shape, dtype, str(threads), fmt(median(values)), fmt_range(values), str(len(values))])
    rep.table(["shape", "dtype", "threads", "median GFLOP/s", "range", "samples"], rows)


def quick_spec(spec: TrainSpec) -> bool:
    """The contestants --quick keeps: one of each kind."""
    if spec.skip_elementwise:
        return False
    if spec.impl == "ours":
        return spec.adamw == "fused" and (spec.loss == "full" or (spec.bf16 and spec.chunk == 256))
    if spec.impl == "peer":
        return spec.adamw == ("fused" if spec.bf16 else "default")
    return False


def section_train(state: State) -> None:
    args, rep = state.args, state.report
    rep.add("## 2. Training throughput (one full optimizer step)")
    rep.add()
    rep.add(
        "Forward, loss, backward, AdamW step, zero_grad on a fixed random batch. "
        f"AdamW lr {OPTIM.lr}, betas ({OPTIM.beta1}, {OPTIM.beta2}), weight decay {OPTIM.weight_decay} "
        "for everyone (ours: `build_optimizer`, no decay on biases/norms). "
        "Model FLOPs per token = 6 x (matmul weights incl. LM head) + 12 x n_layer x n_embd x T "
        "(both models have the same matmul weights; the peer's LM head is untied). "
        "The peer's loss is `F.cross_entropy(logits.flatten(0, 1), y.flatten())`. "
        "Speed-up is against the peer's GPTModel in fp32 with AdamW's default (the book's setup), "
        "median of per-repeat ratios. Page faults are minor faults per step."
    )
    rep.add()
    for shape_name in args.shapes:
        shape = SHAPES[shape_name]
        batch = shape.batch_size(args.batch_div)
        specs = [TrainSpec(shape_name, "ours", False)]
        if shape.vocab > 1000:
            specs.append(TrainSpec(shape_name, "ours", False, "fused", 256))
        specs.append(TrainSpec(shape_name, "ours", True))
        specs.append(TrainSpec(shape_name, "ours", True, attention="sdpa"))
        if shape.vocab < 1000:  # where the LM head is not most of the step (char)
            specs.append(TrainSpec(shape_name, "ours", True, skip_elementwise=True))
        if shape.vocab > 1000:
            specs += [TrainSpec(shape_name, "ours", True, "fused", c) for c in args.chunks]
            specs.append(TrainSpec(shape_name, "ours", True, "fused", 256, adamw="default"))
        specs += [
            TrainSpec(shape_name, "peer", False, adamw="default"),
            TrainSpec(shape_name, "peer", False),
            TrainSpec(shape_name, "peer", True, adamw="default"),
            TrainSpec(shape_name, "peer", True),
            TrainSpec(shape_name, "peer-fast", True),
        ]
        if load_peer() is None:
            specs = [s for s in specs if s.impl == "ours"]
        if args.quick:
            specs = [s for s in specs if quick_spec(s)]
        entries = [TrainEntry(s) for s in specs]
        run_interleaved(
            entries,
            args.repeats,
            args.steps,
            args.warmup,
            args.batch_div,
            state.matmul,
            f"train {shape_name}",
            lambda r, name=shape_name, b=batch: state.bound.measure("train", name, b, r),
        )
        baseline = next(
            (e for e in entries if e.spec == TrainSpec(shape_name, "peer", False, adamw="default")), None
        )
        rep.add(
            f"### {shape_name}: vocab {shape.vocab}, context {shape.context}, {shape.n_layer} layers, "
            f"{shape.n_head} heads, {shape.n_embd} wide, batch {batch}"
        )
        rep.add()
        rep.add(
            f"{shape.matmul_params() / 1e6:.2f} M matmul weights, "
            f"{shape.flops_per_token() / 1e6:.1f} MFLOP per token, "
            f"{shape.flops_per_token() * batch * shape.context / 1e9:.1f} GFLOP per step."
        )
        rep.add()
        rep.table(TRAIN_HEADERS, train_rows(entries, baseline))
        fused = [
            e for e in entries if e.spec.impl == "ours" and e.spec.bf16 and e.spec.loss == "fused" and e.tps
        ]
        fused = [e for e in fused if e.spec.adamw == "fused"]
        if fused and shape_name == "small":
            state.best_chunk = max(fused, key=lambda e: median(list(e.tps.values()))).spec.chunk
            rep.add(f"Fastest fused-CE chunk on this run: {state.best_chunk} rows.")
            rep.add()
        headroom_note(rep, entries)
        for kind in ("ours", "peer"):
            timed = [
                e for e in entries if e.spec.impl.startswith(kind) and e.tps and not e.spec.skip_elementwise
            ]
            if timed:
                best = max(timed, key=lambda e: median(list(e.tps.values())))
                state.fastest[f"{shape_name} {kind}"] = (best.spec.name, "train", best.tps)
        for e in entries:
            e.release()
        gc.collect()


def headroom_note(rep: Report, entries: list[TrainEntry], where: str = "") -> None:
    """What the step without softmax, GELU and LayerNorm says about the fastest peer row."""
    timed = [e for e in entries if e.tps]
    bare = next((e for e in timed if e.spec.skip_elementwise), None)
    peers = [e for e in timed if e.spec.impl != "ours"]
    if bare is None or not peers:
        return
    whole = replace(bare.spec, skip_elementwise=False)
    ours = next((e for e in timed if e.spec == whole), None)
    if ours is None:
        return
    peer = max(peers, key=lambda e: median(list(e.tps.values())))
    rep.add(
        f"{where}Without softmax, GELU and LayerNorm (the row marked 'not a model': same matmuls, "
        f"embeddings, loss and optimizer), ours runs {fmt(paired_ratio(bare.tps, ours.tps), 2)}x "
        f"its full step, which would be {fmt(paired_ratio(bare.tps, peer.tps), 2)}x the fastest peer "
        f"row ({peer.label}); the full step is {fmt(paired_ratio(ours.tps, peer.tps), 2)}x it."
    )
    rep.add()


def step_matmuls(shape: Shape, batch: int) -> list[tuple[str, int, int, int, int]]:
    """The matrix products of one training step, as (what, batch, m, k, n).

    Each linear layer (in -> out) over N = batch x context rows costs three products: the forward
    (N, in) @ (in, out), the input gradient (N, out) @ (out, in) and the weight gradient
    (out, N) @ (N, in). Attention costs six batched products per layer over batch x heads: QK^T
    and PV forward; dV, dP, dQ, dK backward. Their FLOPs add up to exactly the model FLOPs that
    MFU counts.
    """
    n, c, t = batch * shape.context, shape.n_embd, shape.context
    heads, hs = batch * shape.n_head, shape.n_embd // shape.n_head
    linears = [("q, k, v, out", c, c, 4 * shape.n_layer), ("fc", c, 4 * c, shape.n_layer)]
    linears += [("proj", 4 * c, c, shape.n_layer), ("lm head", c, shape.vocab, 1)]
    products = []
    for what, d_in, d_out, count in linears:
        products += [
            (what, count, n, d_in, d_out),
            (what, count, n, d_out, d_in),
            (what, count, d_out, n, d_in),
        ]
    layers = shape.n_layer
    products += [("attention", layers * heads, t, hs, t), ("attention", layers * heads, t, t, hs)]
    products += [("attention", layers * heads, t, t, hs)] * 3 + [("attention", layers * heads, t, hs, t)]
    return products


class MatmulBound:
    """The matrix products of a training step, each timed alone: one round per training repeat.

    A round takes a few seconds per shape. Spreading the rounds over the run, next to the timed
    blocks they are compared with, keeps a slow phase of the machine from skewing the ceiling.
    """

    def __init__(self) -> None:
        self.rounds: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
        """(section, shape) -> repeat -> seconds per layer kind."""

    def measure(self, section: str, shape_name: str, batch: int, r: int) -> None:
        shape = SHAPES[shape_name]
        seconds: dict[str, float] = {}
        flops = 0
        for what, count, m, k, n in step_matmuls(shape, batch):
            bmm = what == "attention"
            a = torch.randn((count, m, k) if bmm else (m, k)).to(torch.bfloat16)
            b = torch.randn((count, k, n) if bmm else (k, n)).to(torch.bfloat16)
            out = torch.empty((count, m, n) if bmm else (m, n), dtype=torch.bfloat16)
            best = float("inf")
            for _ in range(4):  # the first call sets up the kernel and touches the output
                start = now()
                torch.matmul(a, b, out=out)
                best = min(best, now() - start)
            seconds[what] = seconds.get(what, 0.0) + best * (1 if bmm else count)
            flops += 2 * count * m * k * n
            del a, b, out
        tokens = batch * shape.context
        if flops != shape.flops_per_token() * tokens:
            raise RuntimeError(
                f"step_matmuls counts {flops} FLOPs, the model {shape.flops_per_token() * tokens}"
            )
        self.rounds.setdefault((section, shape_name), {})[r] = seconds

    def totals(self, section: str, shape_name: str) -> dict[int, float]:
        """Seconds of all the step's products, per repeat."""
        return {r: sum(parts.values()) for r, parts in self.rounds.get((section, shape_name), {}).items()}

    def ceilings(self, section: str, shape_name: str, batch: int) -> dict[int, float]:
        """Tokens/s of a step that was nothing but its matrix products, per repeat."""
        tokens = batch * SHAPES[shape_name].context
        return {r: tokens / total for r, total in self.totals(section, shape_name).items()}


def section_bound(state: State) -> None:
    """How fast a step could be if it were nothing but its matrix products."""
    args, rep = state.args, state.report
    batches = {name: shape.batch_size(args.batch_div) for name, shape in SHAPES.items()}
    for name in args.shapes:
        if not state.bound.totals("train", name):  # section 2 did not run: measure here
            for r in range(args.repeats):
                log(f"[bound] {name} repeat {r + 1}/{args.repeats}")
                state.matmul.probe("bf16")
                state.bound.measure("train", name, batches[name], r)
    rep.add("## 2b. The matmul bound")
    rep.add()
    rep.add(
        "Every matrix product of one training step at each shape (`step_matmuls`), timed alone in "
        "bf16 on preallocated operands and outputs (no allocation, no casts, no page faults), best "
        "of 3 per product. Their sum is a floor on the step time of *any* implementation that uses "
        "PyTorch's CPU matmuls, so tokens per step / sum is a ceiling on its tokens/s. The flash "
        "attention kernel's recomputation, the loss, the norms, the optimizer and the casts are "
        "left out, which only makes the ceiling higher. One round per repeat, taken at the start "
        "of each repeat of section 2 (and of the allocator section), so that it sees the same "
        "phases of the machine as the timed steps it is compared with; medians over the rounds. "
        "Ceiling MFU is against the median bf16 probe of the run."
    )
    rep.add()
    probes = state.matmul.samples.get((PROBE_SHAPE, "bf16", torch.get_num_threads()), [])
    peak = median(probes)
    rows = []
    for name in args.shapes:
        rounds = state.bound.rounds.get(("train", name), {})
        totals = list(state.bound.totals("train", name).values())
        if not totals:
            continue
        kinds = {
            what: median([parts[what] for parts in rounds.values()]) for what in next(iter(rounds.values()))
        }
        total = median(totals)
        ceilings = list(state.bound.ceilings("train", name, batches[name]).values())
        flops = SHAPES[name].flops_per_token() * batches[name] * SHAPES[name].context
        parts = ", ".join(f"{k} {1e3 * v:.0f}" for k, v in kinds.items())
        rows.append(
            [
                name,
                f"{1e3 * total:.0f} ({parts})",
                fmt(median(ceilings)),
                fmt_range(ceilings),
                fmt(100 * flops / total / 1e9 / peak, 1),
                str(len(totals)),
            ]
        )
    rep.table(
        [
            "shape",
            "matmul ms per step (by layer kind)",
            "ceiling tokens/s",
            "range",
            "ceiling MFU %",
            "rounds",
        ],
        rows,
    )
    rows = []
    for key, (label, section, tps) in state.fastest.items():
        name = key.split()[0]
        ceilings = state.bound.ceilings(section, name, batches[name])
        share = paired_ratio(tps, ceilings)
        if share == share:  # not NaN: the bound was measured next to these blocks
            rows.append(
                [name, label, fmt(median(list(tps.values()))), fmt(100 * share, 0), f"{fmt(1 / share, 2)}x"]
            )
    if rows:
        rep.add(
            "The fastest of ours and of the peer in each measurement above (section 2 in the main "
            "process's allocator setting, the lever table per setting) against the ceiling, as the "
            "median over repeats of tokens/s / the ceiling measured in the same repeat. The last "
            "column is the largest speed-up over that row any implementation could reach with these "
            "kernels."
        )
        rep.add()
        rep.table(["shape", "fastest", "tokens/s", "% of ceiling", "ceiling / this"], rows)


# glibc mallopt parameters
M_MMAP_MAX = -4
MALLOC_VARIANTS: dict[str, dict[int, int]] = {
    "default": {},
    "tuned": dict(allocator.SETTINGS),  # exactly what train.py applies (--keep_freed_memory)
    "nommap": {M_MMAP_MAX: 0, allocator.M_TRIM_THRESHOLD: allocator.SETTINGS[allocator.M_TRIM_THRESHOLD]},
}
MALLOC_DESCRIPTIONS = {
    "default": "glibc defaults (allocations above a dynamic threshold, at most 32 MiB, are mmap'ed "
    "and unmapped on free)",
    "tuned": "mallopt(M_MMAP_THRESHOLD, 1 GiB) + mallopt(M_TRIM_THRESHOLD, 2 GiB - 1): big tensors "
    "come from the heap, which keeps its pages",
    "nommap": "mallopt(M_MMAP_MAX, 0) + mallopt(M_TRIM_THRESHOLD, 2 GiB - 1): never mmap",
}


def apply_malloc(variant: str) -> str:
    """Apply a MALLOC_VARIANTS entry to this process; returns '' or a reason it could not."""
    settings = MALLOC_VARIANTS[variant]
    if not settings:
        return ""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as error:
        return f"no glibc mallopt ({error})"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    failed = [param for param, value in settings.items() if mallopt(param, value) != 1]
    return f"mallopt rejected parameters {failed}" if failed else ""


class Worker:
    """A benchmark subprocess with its own allocator settings, driven one timed block at a time."""

    def __init__(self, variant: str, args: argparse.Namespace) -> None:
        self.variant = variant
        command = [sys.executable, os.path.abspath(__file__), "--worker", variant]
        command += ["--threads", str(torch.get_num_threads()), "--batch-div", str(args.batch_div)]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def call(self, **message: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(WORKER_MARK):
                return json.loads(line[len(WORKER_MARK) :])
        raise RuntimeError(f"worker {self.variant} exited with code {self.proc.wait()}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call(cmd="quit")
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=30)
        if self.proc.poll() is None:
            self.proc.kill()


def peak_rss_of_this_process() -> float:
    """VmHWM in MiB (ru_maxrss would include the parent's peak, which Linux carries across exec)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker_main(args: argparse.Namespace) -> None:
    """Subprocess side of Worker: JSON commands on stdin, marked JSON replies on stdout."""
    global QUIET, DEFAULT_THREADS
    QUIET = True
    DEFAULT_THREADS = args.threads
    problem = apply_malloc(args.worker)  # a second time is harmless; gets the error message
    torch.set_num_threads(args.threads)
    reply_to = sys.stdout
    sys.stdout = sys.stderr  # anything else printed must not be mistaken for a reply
    matmul = Matmul()
    entries: list[TrainEntry] = []

    def reply(**message: Any) -> None:
        reply_to.write(WORKER_MARK + json.dumps(message) + "\n")
        reply_to.flush()

    for line in sys.stdin:
        message = json.loads(line)
        if message["cmd"] == "build":
            entries = [TrainEntry(TrainSpec(**s)) for s in message["specs"]]
            for entry in entries:
                if not problem:
                    entry.prepare(message["warmup"], args.batch_div)
            reply(problem=problem, errors=[problem or e.error for e in entries])
        elif message["cmd"] == "run":
            entry = entries[message["index"]]
            r = message["repeat"]
            entry.measure(r, message["steps"], matmul)
            peak_rss_mib = peak_rss_of_this_process()
            reply(tps=entry.tps.get(r), mfu=entry.mfu.get(r), faults=entry.faults.get(r), rss=peak_rss_mib)
        elif message["cmd"] == "quit":
            reply()
            return


def section_alloc(state: State) -> None:
    args, rep = state.args, state.report
    cores = os.cpu_count() or 1
    many = torch.get_num_threads()
    thread_counts = sorted({1, many})
    best = state.best_chunk
    specs = []  # grouped by thread count, so each process switches threads at most twice a round
    for t in thread_counts:
        specs.append(TrainSpec("small", "ours", True, "fused", best, threads=t))
        if load_peer() is not None:
            specs.append(TrainSpec("small", "peer", True, threads=t))
    if not args.quick:
        specs.append(TrainSpec("small", "ours", True, threads=many))
        if load_peer() is not None:
            specs.append(TrainSpec("small", "peer", False, adamw="default", threads=many))
            specs.append(TrainSpec("small", "peer-fast", True, threads=many))
        if "char" in args.shapes:  # train.py's allocator setting at the char shape too
            specs.append(TrainSpec("char", "ours", True, threads=many))
            specs.append(TrainSpec("char", "ours", True, skip_elementwise=True, threads=many))
            if load_peer() is not None:
                specs.append(TrainSpec("char", "peer", True, threads=many))
                specs.append(TrainSpec("char", "peer-fast", True, threads=many))
    shapes = sorted({spec.shape for spec in specs}, key=list(SHAPES).index)
    variants = args.malloc
    log(f"[alloc] starting {len(variants)} worker processes: {', '.join(variants)}")
    workers = {v: Worker(v, args) for v in variants}
    results: dict[tuple[str, int], TrainEntry] = {}
    problems: dict[str, str] = {}
    peak_rss: dict[str, float] = {}
    try:
        for v, worker in workers.items():
            answer = worker.call(cmd="build", specs=[asdict(s) for s in specs], warmup=args.warmup)
            problems[v] = answer["problem"]
            for i, spec in enumerate(specs):
                results[v, i] = TrainEntry(spec, error=answer["errors"][i])
        for r in range(args.repeats):
            log(f"[alloc] repeat {r + 1}/{args.repeats}")
            for name in shapes:
                state.bound.measure("alloc", name, SHAPES[name].batch_size(args.batch_div), r)
            for i in rotated(list(range(len(specs))), r):
                for v in rotated(list(variants), r):
                    entry = results[v, i]
                    if entry.error:
                        continue
                    answer = workers[v].call(cmd="run", index=i, repeat=r, steps=args.steps)
                    entry.tps[r], entry.mfu[r], entry.faults[r] = (
                        answer["tps"],
                        answer["mfu"],
                        answer["faults"],
                    )
                    peak_rss[v] = max(peak_rss.get(v, 0.0), answer["rss"])
                    log(f"  [{r}] {v:8s} {specs[i].name}: {answer['tps']:,.0f} tok/s")
    finally:
        for worker in workers.values():
            worker.close()
    for v in variants:
        for name in shapes:
            for kind in ("ours", "peer"):
                timed = [
                    (spec, results[v, i])
                    for i, spec in enumerate(specs)
                    if spec.shape == name
                    and spec.impl.startswith(kind)
                    and spec.threads == many
                    and not spec.skip_elementwise
                    and results[v, i].tps
                ]
                if timed:
                    spec, best = max(timed, key=lambda pair: median(list(pair[1].tps.values())))
                    label = f"{spec.name}, allocator {v}"
                    state.fastest[f"{name} {kind} {v}"] = (label, "alloc", best.tps)
    rep.add("## Levers: allocator settings and threads")
    rep.add()
    rep.add(
        "Each allocator setting runs in its own fresh process (applied with ctypes `mallopt` before "
        "any tensor exists); the processes take turns, one timed block at a time, and every process "
        "runs every contestant, so each setting is applied equally to ours and the peer. "
        f"Threads: `torch.set_num_threads` before each block ({cores} cores visible). Small shape "
        f"(and the char shape at {many} threads), same batches and optimizer settings as section 2. "
        "Speed-up is against the same contestant "
        f"with the first setting ({variants[0]}) at the same thread count; MFU is against the matmul "
        "probe at the block's thread count."
    )
    rep.add()
    for v in variants:
        not_applied = f" — NOT APPLIED: {problems[v]}" if problems[v] else ""
        rep.add(f"- **{v}**: {MALLOC_DESCRIPTIONS[v]}{not_applied}")
    rep.add()
    rows = []
    for i, spec in enumerate(specs):
        base = results[variants[0], i]
        for v in variants:
            e = results[v, i]
            tps = list(e.tps.values())
            if e.error or not tps:
                rows.append([spec.shape, spec.name, v, e.error or "failed", "", "", "", ""])
                continue
            rows.append(
                [
                    spec.shape,
                    spec.name,
                    v,
                    fmt(median(tps)),
                    fmt_range(tps),
                    fmt(100 * median(list(e.mfu.values())), 1),
                    f"{fmt(paired_ratio(e.tps, base.tps), 2)}x",
                    fmt(median(list(e.faults.values()))),
                ]
            )
    rep.table(
        ["shape", "contestant", "malloc", "tokens/s", "range", "MFU %", "speed-up", "page faults/step"], rows
    )
    for v in variants:
        char = [results[v, i] for i, spec in enumerate(specs) if spec.shape == "char"]
        headroom_note(rep, char, f"Char shape, allocator {v}. ")
    if peak_rss:
        rep.add(
            "Peak resident memory of each process (all its contestants' models and optimizer states "
            "live at once): "
            + ", ".join(f"{v} {peak_rss[v]:,.0f} MiB" for v in variants if v in peak_rss)
            + "."
        )
        rep.add()
    if len(thread_counts) > 1:
        rows = []
        for i, spec in enumerate(specs):
            if spec.threads != many:
                continue
            j = next(
                (k for k, s in enumerate(specs) if s == TrainSpec(**{**asdict(spec), "threads": 1})), None
            )
            if j is None:
                continue
            for v in variants:
                ratio = paired_ratio(results[v, i].tps, results[v, j].tps)
                rows.append([spec.name, v, f"{fmt(ratio, 2)}x"])
        rep.add(f"{many} threads vs 1 thread, same process and allocator setting:")
        rep.add()
        rep.table(["contestant", "malloc", f"{many} threads / 1 thread"], rows)


def section_compile(state: State) -> None:
    args, rep = state.args, state.report
    rep.add("## torch.compile")
    rep.add()
    cache = tempfile.mkdtemp(prefix="bench-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # cold compile: nothing cached from earlier runs
    specs = []
    for shape_name in args.shapes:
        specs += [TrainSpec(shape_name, "ours", True), TrainSpec(shape_name, "ours", True, compile=True)]
        if load_peer() is not None:
            specs += [TrainSpec(shape_name, "peer", True), TrainSpec(shape_name, "peer", True, compile=True)]
    entries = [TrainEntry(s) for s in specs]
    try:
        run_interleaved(
            entries, args.repeats, args.steps, args.warmup, args.batch_div, state.matmul, "compile"
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    rep.add(
        "bf16 autocast. Ours compiles `model.features`, as `--model.compile true` does (the LM "
        "head and the loss stay eager); the peer compiles the whole model (its loss stays eager). "
        "Compile time = first step minus the eager contestant's median step time (cold inductor "
        "cache); validation compiles once more (no-grad graph)."
    )
    rep.add()
    rows = []
    for e in entries:
        tps = list(e.tps.values())
        if e.error or not tps:
            rows.append([e.spec.shape, e.label, "failed", "", "", "", e.error or ""])
            continue
        eager = next(b for b in entries if b.spec == TrainSpec(**{**asdict(e.spec), "compile": False}))
        compile_s = ""
        if e.spec.compile and eager.tps:
            compile_s = fmt(e.first_step_s - e.tokens / median(list(eager.tps.values())), 1)
        rows.append(
            [
                e.spec.shape,
                e.label,
                fmt(median(tps)),
                fmt(100 * median(list(e.mfu.values())), 1),
                f"{fmt(paired_ratio(e.tps, eager.tps), 2)}x",
                compile_s,
                "",
            ]
        )
    rep.table(["shape", "contestant", "tokens/s", "MFU %", "vs eager", "compile s", "note"], rows)
    for e in entries:
        e.release()
    gc.collect()


def section_lightning(state: State) -> None:
    import lightning as L
    from torch.utils.data import DataLoader

    from minigpt.training.lit import LitGPT
    from minigpt.training.optim import build_scheduler

    args, rep = state.args, state.report
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")

    shape = SHAPES["small"]
    batch = shape.batch_size(args.batch_div)
    warmup = max(1, args.warmup)
    total = warmup + args.steps
    g = torch.Generator().manual_seed(99)
    batches = [
        (
            torch.randint(shape.vocab, (batch, shape.context), generator=g),
            torch.randint(shape.vocab, (batch, shape.context), generator=g),
        )
        for _ in range(total)
    ]
    loader = DataLoader(batches, batch_size=None, shuffle=False)
    optim = OptimConfig(**{**asdict(OPTIM), "warmup_steps": 10})

    def new_lit() -> LitGPT:
        torch.manual_seed(0)
        lit = LitGPT(gpt=shape.gpt_config(), optim=optim)
        # LitGPT builds its GPT in configure_model from trainer.datamodule.tokenizer; with a plain
        # DataLoader there is no datamodule, so the model is set here and configure_model keeps it.
        lit.model = GPT(shape.gpt_config())
        return lit

    class StepTimes(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_end(self, *unused: Any) -> None:
            self.times.append(now())

    lit = new_lit()
    bare = new_lit()  # only its model and `loss` are used; LitGPT's hooks need a Trainer
    bare_params = list(bare.model.parameters())
    clip = getattr(optim, "grad_clip", None)

    def bare_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if hasattr(bare, "loss"):
            return bare.loss(x, y)
        return next_token_loss(bare.model(x), y)

    bare_opt = build_optimizer(bare.model, optim)
    bare_sched = build_scheduler(bare_opt, optim, 10_000)

    lit_tps: dict[int, float] = {}
    bare_tps: dict[int, float] = {}
    lit_mfu: dict[int, float] = {}
    bare_mfu: dict[int, float] = {}
    fit_seconds: list[float] = []
    flops_per_step = shape.flops_per_token() * batch * shape.context

    def run_lightning(r: int) -> None:
        timer = StepTimes()
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            precision="bf16-mixed",
            max_steps=total,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            callbacks=[timer],
        )
        peak = state.matmul.probe("bf16")
        threads = torch.get_num_threads()
        start = now()
        trainer.fit(lit, train_dataloaders=loader)
        fit_seconds.append(now() - start)
        torch.set_num_threads(threads)
        seconds = timer.times[-1] - timer.times[warmup - 1]
        lit_tps[r] = batch * shape.context * args.steps / seconds
        lit_mfu[r] = flops_per_step * args.steps / seconds / (peak * 1e9)
        log(f"  [{r}] Lightning: {lit_tps[r]:,.0f} tok/s (fit() {fit_seconds[-1]:.1f} s)")

    def run_bare(r: int) -> None:
        peak = state.matmul.probe("bf16")
        times = []
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = bare_loss(x, y)
            if not torch.isfinite(loss):  # LitGPT checks the loss and the gradient norm too
                raise RuntimeError(f"loss is {loss.item()}")
            loss.backward()
            if clip is not None:
                norm = torch.nn.utils.clip_grad_norm_(bare_params, clip)
                if not torch.isfinite(norm):
                    raise RuntimeError(f"gradient norm is {norm.item()}")
            bare_opt.step()
            bare_sched.step()
            bare_opt.zero_grad(set_to_none=True)
            times.append(now())
        seconds = times[-1] - times[warmup - 1]
        bare_tps[r] = batch * shape.context * args.steps / seconds
        bare_mfu[r] = flops_per_step * args.steps / seconds / (peak * 1e9)
        log(f"  [{r}] bare loop: {bare_tps[r]:,.0f} tok/s")

    log("[lightning] LitGPT + Trainer vs a bare loop")
    error = ""
    try:
        for r in range(args.repeats):
            log(f"[lightning] repeat {r + 1}/{args.repeats}")
            for run in rotated([run_lightning, run_bare], r):
                run(r)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        log(f"  FAILED: {error}")

    rep.add("## 3. Lightning overhead")
    rep.add()
    rep.add(
        f"Small shape, batch {batch}, bf16 autocast (`precision='bf16-mixed'`), `build_optimizer` + "
        f"`build_scheduler`, gradient clipping to {clip} (OptimConfig.grad_clip, which LitGPT applies "
        "itself). Lightning: `Trainer(accelerator='cpu', logger=False, enable_checkpointing=False, "
        "enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)` with a plain "
        "DataLoader of in-memory batches; `lit.model` is set before `fit` because `configure_model` "
        "otherwise needs `trainer.datamodule.tokenizer`. Bare loop: the same work written out on the "
        "same batches and a copy of the same initial model — `LitGPT.loss` "
        f"(fused_loss={getattr(lit, 'fused_loss', 'n/a')}), the finiteness checks "
        "LitGPT makes, `clip_grad_norm_`, AdamW step, scheduler step, zero_grad."
        f" Throughput counts the {args.steps} steps after {warmup} warm-up "
        "step(s) of each `fit()`; `fit()` wall time also includes its start-up."
    )
    rep.add()
    if error:
        rep.add(f"FAILED: {error}")
        rep.add()
    if lit_tps and bare_tps:
        overhead = paired_ratio(bare_tps, lit_tps) - 1
        rows = [
            [
                "bare PyTorch loop",
                fmt(median(list(bare_tps.values()))),
                fmt_range(list(bare_tps.values())),
                fmt(100 * median(list(bare_mfu.values())), 1),
                "",
                "",
            ],
            [
                "LitGPT + Trainer",
                fmt(median(list(lit_tps.values()))),
                fmt_range(list(lit_tps.values())),
                fmt(100 * median(list(lit_mfu.values())), 1),
                f"{fmt(100 * overhead, 1)} %",
                fmt(median(fit_seconds), 1),
            ],
        ]
        rep.table(["loop", "tokens/s", "range", "MFU %", "step overhead", f"fit() s ({total} steps)"], rows)


def load_peer_kv() -> Any:
    """The peer's GPT-2 with a KV cache (``llms_from_scratch.kv_cache.gpt2``), or None."""
    if load_peer() is None:
        return None
    try:
        from llms_from_scratch.kv_cache import gpt2, utils
    except ImportError as error:
        log(f"NOTE: the peer's kv_cache module is missing ({error}); its row is skipped.")
        return None
    return gpt2, utils


def peer_cached_generate(model: Any, kv_utils: Any, idx: torch.Tensor, new: int) -> torch.Tensor:
    """Greedy decoding with the peer's KV cache.

    The package's own ``kv_cache.generate.generate_text_simple`` calls the GPT-2 model without
    ``use_cache=True``, so with that model every step sees only the newest token. This loop
    passes the flag, which is how the model is meant to be called.
    """
    with torch.no_grad():
        cache = kv_utils.KVCache(n_layers=len(model.trf_blocks))
        model.current_pos = 0
        logits = model(idx, use_cache=True, cache=cache)
        for _ in range(new):
            next_id = logits[:, -1].argmax(dim=-1, keepdim=True)
            idx = torch.cat([idx, next_id], dim=1)
            logits = model(next_id, use_cache=True, cache=cache)
    return idx


@torch.inference_mode()
def plain_cached_generate(model: GPT, idx: torch.Tensor, new: int) -> torch.Tensor:
    """Greedy decoding with a KV cache written the straightforward way, as the peers' caches are:
    the model's own forward (all positions through the LM head) on its training layout. The
    reference our decoding path is measured against. Needs prompt + new <= context."""
    caches = model.new_kv_caches(idx.shape[0])
    logits = model(idx, caches)
    for _ in range(new):
        next_id = logits[:, -1].argmax(dim=-1, keepdim=True)
        idx = torch.cat([idx, next_id], dim=1)
        logits = model(next_id, caches)
    return idx


def section_generate(state: State) -> None:
    args, rep = state.args, state.report
    shape = SHAPES["small"]
    new = args.new_tokens
    peer = load_peer()
    peer_kv = load_peer_kv()
    log("[generate] building models")

    @dataclass
    class GenEntry:
        label: str
        context: int
        prompt_len: int
        fn: Callable[[], torch.Tensor]
        tps: dict[int, float] = field(default_factory=dict)
        outputs: list[torch.Tensor] = field(default_factory=list)

    entries: list[GenEntry] = []
    for context in (shape.context, 2 * shape.context):
        # With the 128 context the window slides for the last tokens; with 256 everything fits.
        prompt_len = max(8, shape.context + 8 - new) if context == shape.context else 8
        g = torch.Generator().manual_seed(7)
        prompt = torch.randint(shape.vocab, (1, prompt_len), generator=g)
        torch.manual_seed(0)
        trained = GPT(shape.gpt_config(context)).eval()
        decoding = optimize_for_decoding(copy.deepcopy(trained))
        for label, model, cache in (
            ("ours, KV cache (generate.py)", decoding, True),
            ("ours, no cache", decoding, False),
            ("ours, KV cache, training layout", trained, True),
        ):
            entries.append(
                GenEntry(
                    label,
                    context,
                    prompt_len,
                    lambda m=model, p=prompt, c=cache: generate(m, p, new, temperature=0.0, use_cache=c),
                )
            )
        if prompt_len + new <= context:
            entries.append(
                GenEntry(
                    "plain KV cache (model forward, training layout)",
                    context,
                    prompt_len,
                    lambda m=trained, p=prompt: plain_cached_generate(m, p, new),
                )
            )
        if peer is not None:
            torch.manual_seed(0)
            model = peer.GPTModel(shape.peer_config(context)).eval()
            entries.append(
                GenEntry(
                    "peer, no cache (generate_text_simple)",
                    context,
                    prompt_len,
                    lambda m=model, p=prompt, c=context: peer.generate_text_simple(m, p, new, c),
                )
            )
            # The peer's cache has no sliding window: it can only run while everything fits.
            if peer_kv is not None and prompt_len + new <= context:
                kv_model = peer_kv[0].GPTModel(shape.peer_config(context)).eval()
                # Same weights as the uncached peer (its mask buffer has no counterpart here).
                kv_model.load_state_dict(model.state_dict(), strict=False)
                entries.append(
                    GenEntry(
                        "peer, KV cache (kv_cache.gpt2)",
                        context,
                        prompt_len,
                        lambda m=kv_model, p=prompt: peer_cached_generate(m, peer_kv[1], p, new),
                    )
                )
    failed: list[str] = []
    for e in list(entries):
        try:
            e.fn()  # warm-up
        except Exception as error:  # a peer's code path that does not run: report it, keep going
            failed.append(f"- {e.label} (context {e.context}) fails: `{type(error).__name__}: {error}`")
            entries.remove(e)
    for r in range(args.repeats):
        log(f"[generate] repeat {r + 1}/{args.repeats}")
        for e in rotated(entries, r):
            start = now()
            out = e.fn()
            e.tps[r] = new / (now() - start)
            e.outputs.append(out)
            log(f"  [{r}] context {e.context} {e.label}: {e.tps[r]:,.1f} tok/s")

    rep.add("## 4. Generation")
    rep.add()
    rep.add(
        f"Batch 1, {new} new tokens, greedy, fp32, {torch.get_num_threads()} threads, small shape "
        "(vocabulary 50257) with random weights. With context 128 the window slides once prompt + "
        "generated tokens exceed it (our KV cache is then rebuilt each step; the peer's cache "
        "cannot slide, so it has no row there); with context 256 everything fits. generate.py "
        "runs the first row: the model re-laid out by `optimize_for_decoding`, and the LM head as "
        "`LastTokenHead` (both in `model/generation.py`). The third row is the same cache on the "
        "model as it comes from training. 'plain KV cache' is a straightforward cached loop (the "
        "model's forward with full logits each step), the way the peers' caches work. Speed-ups "
        "are median per-repeat ratios."
    )
    rep.add()
    if failed:
        rep.add("Rows left out because the contestant raised an error on its first run:")
        rep.add()
        for line in failed:
            rep.add(line)
        rep.add()
    rows = []
    for context in (shape.context, 2 * shape.context):
        group = [e for e in entries if e.context == context]
        peer_plain = next((e for e in group if e.label.startswith("peer, no cache")), None)
        peer_cached = next((e for e in group if e.label.startswith("peer, KV cache")), None)
        plain_cached = next((e for e in group if e.label.startswith("plain KV cache")), None)
        for e in group:
            vals = list(e.tps.values())
            rows.append(
                [
                    str(context),
                    str(e.prompt_len),
                    e.label,
                    fmt(median(vals), 1),
                    fmt_range(vals, 1),
                    f"{fmt(paired_ratio(e.tps, peer_plain.tps), 2)}x" if peer_plain else "n/a",
                    f"{fmt(paired_ratio(e.tps, plain_cached.tps), 2)}x" if plain_cached else "n/a",
                    f"{fmt(paired_ratio(e.tps, peer_cached.tps), 2)}x" if peer_cached else "n/a",
                ]
            )
        ours = [e for e in group if not e.label.startswith("peer")]
        reference = ours[1].outputs[0]  # uncached
        same = all(torch.equal(out, reference) for e in ours for out in e.outputs)
        line = f"- context {context}: our rows produce {'**identical**' if same else '**DIFFERENT**'}"
        line += f" tokens in all {len(ours[0].outputs)} repeats"
        if peer_plain and peer_cached:
            pairs = zip(peer_plain.outputs, peer_cached.outputs, strict=True)
            peer_same = all(torch.equal(a, b) for a, b in pairs)
            line += f"; the peer's cached and uncached tokens are {'identical' if peer_same else 'different'}"
        rep.add(line)
    rep.add()
    rep.table(
        [
            "context",
            "prompt",
            "generator",
            "tokens/s",
            "range",
            "vs peer no cache",
            "vs plain cache",
            "vs peer cache",
        ],
        rows,
    )


def section_data(state: State) -> None:
    import datasets

    from minigpt.data import DataConfig, GPT2Tokenizer, prepare

    args, rep = state.args, state.report
    datasets.disable_progress_bars()
    source = args.text or "shakespeare"
    config = DataConfig(source=source, tokenizer="gpt2")
    text: str | None = None
    if args.text is None:
        from minigpt.data.shakespeare import shakespeare_path

        text = shakespeare_path().read_text(encoding="utf-8")
    elif Path(args.text).is_file() and Path(args.text).suffix == ".txt":
        text = Path(args.text).read_text(encoding="utf-8")
    tokenizer = GPT2Tokenizer()
    prep_mbs: dict[int, float] = {}
    enc_mbs: dict[int, float] = {}
    info: dict[str, Any] = {}

    def run_prepare(r: int) -> None:
        root = tempfile.mkdtemp(prefix="bench-prepare-")
        try:
            start = now()
            prepared = prepare(config, cache_root=root)
            seconds = now() - start
            info.update(prepared.meta)
            prep_mbs[r] = prepared.meta["text_bytes"] / 1e6 / seconds
            log(f"  [{r}] prepare: {prep_mbs[r]:.2f} MB/s")
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def run_encode(r: int) -> None:
        if text is None:
            return
        start = now()
        tokenizer.encode_to_arrays([text])
        enc_mbs[r] = len(text.encode("utf-8")) / 1e6 / (now() - start)
        log(f"  [{r}] tokenizer only: {enc_mbs[r]:.2f} MB/s")

    log("[data] preparing into fresh temporary caches")
    for r in range(args.repeats):
        for run in rotated([run_prepare, run_encode], r):
            run(r)
    rep.add("## 5. Data preparation")
    rep.add()
    described = "the built-in shakespeare corpus" if args.text is None else f"`{Path(args.text).name}`"
    rep.add(
        f"`minigpt.data.prepare` with the GPT-2 tokenizer on {described} "
        f"({info.get('text_bytes', 0) / 1e6:.2f} MB, "
        f"{info.get('train_tokens', 0) + info.get('val_tokens', 0):,} tokens), each repeat into a fresh "
        "temporary cache folder: read, tokenize, write the memmaps. 'Tokenizer only' is "
        "`GPT2Tokenizer.encode_to_arrays` on the same text in memory."
    )
    rep.add()
    rows = [
        [
            "prepare() raw text -> memmap",
            fmt(median(list(prep_mbs.values())), 2),
            fmt_range(list(prep_mbs.values()), 2),
        ]
    ]
    if enc_mbs:
        rows.append(
            ["tokenizer only", fmt(median(list(enc_mbs.values())), 2), fmt_range(list(enc_mbs.values()), 2)]
        )
    rep.table(["stage", "MB/s", "range"], rows)


# -- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="timed blocks per contestant (default 5; quick 1)"
    )
    p.add_argument(
        "--steps", type=int, default=None, help="training steps per timed block (default 2; quick 1)"
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed training steps per contestant (default 1)")
    p.add_argument(
        "--quick", action="store_true", help="~1 minute smoke run: batch / 4, few contestants, no compile"
    )
    p.add_argument(
        "--only", default=None, help=f"comma-separated sections to run (default all): {', '.join(SECTIONS)}"
    )
    p.add_argument(
        "--shapes", default="small,char", help="training shapes for section 2 (default small,char)"
    )
    p.add_argument(
        "--chunks", default=None, help="fused-CE chunk_rows to try (default 128,256,512,1024; quick 256)"
    )
    p.add_argument(
        "--malloc",
        default=None,
        help=f"allocator settings to compare: {', '.join(MALLOC_VARIANTS)} (default: all; quick: 2)",
    )
    p.add_argument(
        "--allocator",
        default="default",
        choices=list(MALLOC_VARIANTS),
        help="glibc malloc setting of the main process, i.e. every section but alloc (default: default)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens to generate (default 200; quick 24)")
    p.add_argument(
        "--text", default=None, help="text file for section 5 (default: the built-in shakespeare corpus)"
    )
    p.add_argument("--out", default=None, help="also write the markdown report to this file")
    p.add_argument("--batch-div", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", default=None, choices=list(MALLOC_VARIANTS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    args.repeats = args.repeats or (1 if quick else 5)
    args.steps = args.steps or (1 if quick else 2)
    args.new_tokens = args.new_tokens or (24 if quick else 200)
    args.batch_div = args.batch_div or (4 if quick else 1)
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.chunks = [int(c) for c in (args.chunks or ("256" if quick else "128,256,512,1024")).split(",") if c]
    args.malloc = [
        m for m in (args.malloc or ("default,tuned" if quick else ",".join(MALLOC_VARIANTS))).split(",") if m
    ]
    for name in args.shapes:
        if name not in SHAPES:
            p.error(f"unknown shape {name!r}; choose from {', '.join(SHAPES)}")
    for name in args.malloc:
        if name not in MALLOC_VARIANTS:
            p.error(f"unknown malloc setting {name!r}; choose from {', '.join(MALLOC_VARIANTS)}")
    if args.only:
        args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
        for s in args.sections:
            if s not in SECTIONS:
                p.error(f"unknown section {s!r}; choose from {', '.join(SECTIONS)}")
    else:
        args.sections = list(SECTIONS)
        if quick:
            args.sections.remove("compile")  # a cold compile alone takes about a minute
    return args


def main(argv: list[str] | None = None) -> None:
    global DEFAULT_THREADS
    args = parse_args(argv)
    allocator_problem = apply_malloc(args.worker or args.allocator)
    DEFAULT_THREADS = args.threads or torch.get_num_threads()
    use_threads()
    if args.worker:
        worker_main(args)
        return

    started = now()
    report = Report()
    state = State(args, report, Matmul())
    load_peer()
    libc = " ".join(platform.libc_ver())
    report.add(f"# minigpt benchmark — {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}")
    report.add()
    report.add(f"- CPU: {cpu_model()} ({os.cpu_count()} logical cores; {cpu_flags()})")
    report.add(
        f"- torch {torch.__version__}, {torch.get_num_threads()} threads; lightning "
        f"{importlib.metadata.version('lightning')}; python {platform.python_version()}; {libc}"
    )
    report.add(f"- peer: {PEER_PACKAGE} {peer_version()}")
    report.add(
        f"- allocator of the main process: {args.allocator} ({MALLOC_DESCRIPTIONS[args.allocator]})"
        + (f" — NOT APPLIED: {allocator_problem}" if allocator_problem else "")
    )
    with contextlib.suppress(OSError):
        report.add("- load average at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    report.add(
        f"- {args.repeats} repeats x {args.steps} steps per timed block, {args.warmup} warm-up step(s)"
        + (f", batch / {args.batch_div} (--quick)" if args.batch_div > 1 else "")
    )
    report.add(
        f"- command: `python benchmarks/bench.py {shlex.join(sys.argv[1:] if argv is None else argv)}`"
    )
    report.add()

    sections = {
        "train": section_train,
        "bound": section_bound,
        "alloc": section_alloc,
        "compile": section_compile,
        "lightning": section_lightning,
        "generate": section_generate,
        "data": section_data,
    }
    if "matmul" in args.sections and "train" not in args.sections:
        section_matmul_rounds(state)
    body_start = len(report.lines)
    for name in args.sections:
        if name in sections:
            t = now()
            use_threads()
            meter = LoadMeter()
            try:
                sections[name](state)
            except Exception as error:  # one broken section must not lose the others
                report.add(f"## {name}: FAILED — {type(error).__name__}: {error}")
                report.add()
            load = meter.summary()
            if load:
                report.add(load)
                report.add()
            log(f"[{name}] done in {now() - t:.0f} s")
    if "matmul" in args.sections:
        # The peak table goes first but is written last, once every probe has been taken.
        lines, report.lines = report.lines, report.lines[:body_start]
        report_matmul(state)
        report.lines += lines[body_start:]
    report.add(f"_Total benchmark time: {(now() - started) / 60:.1f} min._")
    if args.out:
        Path(args.out).write_text(report.text(), encoding="utf-8")
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
