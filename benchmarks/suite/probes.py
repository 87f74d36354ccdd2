"""Matmul probes: the peak that MFU is measured against, and the matmul bound of a training step."""

from __future__ import annotations

import functools

import torch

from .shapes import Shape, shapes
from .stats import now

PROBE_SHAPE = "2048x2048 @ 2048x2048"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@functools.cache
def matmul_shapes() -> dict[str, tuple[int, int, int]]:
    """The shapes probed, as (m, k, n) by label: the square probe that MFU is measured against,
    and the small shape's LM head over one full training batch."""
    small = shapes()["small"]
    m, k, n = small.batch * small.context, small.n_embd, small.vocab
    return {PROBE_SHAPE: (2048, 2048, 2048), f"{m}x{k} @ {k}x{n}": (m, k, n)}


class Matmul:
    """Matmul throughput probes; every measurement is kept for the peak table."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str, int], list[float]] = {}
        self._inputs: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def _operands(self, shape: str, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
        key = (shape, dtype)
        if key not in self._inputs:
            m, k, n = matmul_shapes()[shape]
            g = torch.Generator().manual_seed(0)
            a = torch.randn(m, k, generator=g).to(DTYPES[dtype])
            b = torch.randn(k, n, generator=g).to(DTYPES[dtype])
            a @ b  # first call pays one-time setup
            self._inputs[key] = (a, b)
        return self._inputs[key]

    def measure(self, shape: str, dtype: str, calls: int = 1) -> float:
        """GFLOP/s of `a @ b` (a fresh output each call, as in a model), best of `calls`."""
        a, b = self._operands(shape, dtype)
        m, k, n = matmul_shapes()[shape]
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
        for shape in matmul_shapes():
            for dtype in DTYPES:
                self.measure(shape, dtype)


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


def time_step_matmuls(shape: Shape, batch: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """Seconds of one training step's matrix products (`step_matmuls`) by layer kind, each product
    timed alone in `dtype` on preallocated operands and output, best of 3 after one warm-up call."""
    seconds: dict[str, float] = {}
    flops = 0
    for what, count, m, k, n in step_matmuls(shape, batch):
        bmm = what == "attention"
        a = torch.randn((count, m, k) if bmm else (m, k)).to(dtype)
        b = torch.randn((count, k, n) if bmm else (k, n)).to(dtype)
        out = torch.empty((count, m, n) if bmm else (m, n), dtype=dtype)
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
        raise RuntimeError(f"step_matmuls counts {flops} FLOPs, the model {shape.flops_per_token() * tokens}")
    return seconds


class MatmulBound:
    """The matrix products of a training step, each timed alone: one round per training repeat.

    A round takes a few seconds per shape. Spreading the rounds over the run, next to the timed
    blocks they are compared with, keeps a slow phase of the machine from skewing the ceiling.
    """

    def __init__(self) -> None:
        self.rounds: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
        """(section, shape) -> repeat -> seconds per layer kind."""

    def measure(self, section: str, shape: Shape, batch: int, r: int) -> None:
        self.rounds.setdefault((section, shape.name), {})[r] = time_step_matmuls(shape, batch)

    def totals(self, section: str, shape_name: str) -> dict[int, float]:
        """Seconds of all the step's products, per repeat."""
        return {r: sum(parts.values()) for r, parts in self.rounds.get((section, shape_name), {}).items()}

    def ceilings(self, section: str, shape: Shape, batch: int) -> dict[int, float]:
        """Tokens/s of a step that was nothing but its matrix products, per repeat."""
        tokens = batch * shape.context
        return {r: tokens / total for r, total in self.totals(section, shape.name).items()}
