"""Muon whose orthogonalisation runs in the precision the device multiplies fast, with the
matrices of one shape orthogonalised together."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .precision import fast_matmul_dtype


class Muon(torch.optim.Muon):
    """`torch.optim.Muon` with the same update, options and state (a checkpoint of one loads into
    the other), computed differently, and with options of its own (measured in
    docs/results/muon.md):

    - **Precision.** The Newton-Schulz steps run in `ns_dtype`; None is the device's own choice,
      bf16 where it is native and fp32 where bf16 products are emulated (`fast_matmul_dtype`).
      Not part of the state: a resumed run orthogonalises in its machine's precision.
    - **Batching.** A group's matrices of one shape go through each step as one batched product;
      Nesterov's look-ahead is computed straight into the stack (`orthogonalise`).
    - **The Gram form.** Matrices at least twice as long one way as the other iterate on their
      small Gram matrix: the same polynomial, fewer FLOPs (`newton_schulz`).
    - **A polynomial per step.** `ns_coefficients` may be a sequence of (a, b, c), one per step
      (`NS_COEFFICIENTS["polar_express"]`); torch's Muon cannot step such a group.
    - **The first scaling.** `ns_norm="gram"` divides by the square root of the Gram matrix's
      Frobenius norm, a tighter bound on the spectral norm than torch's Frobenius norm.
    - **Row blocks.** `row_blocks` maps a parameter to a number of rows, each block orthogonalised
      as a matrix of its own (an attention projection's heads: `build_optimizer`).
    """

    def __init__(
        self,
        params: Any,
        *,
        ns_dtype: torch.dtype | None = None,
        ns_norm: str = "frobenius",
        row_blocks: Mapping[Tensor, int] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(params, **options)
        if ns_norm not in NS_NORMS:
            raise ValueError(f"ns_norm must be one of {', '.join(NS_NORMS)}, got {ns_norm!r}")
        self.ns_dtype = ns_dtype
        self.ns_norm = ns_norm
        self.row_blocks = dict(row_blocks or {})
        for param, rows in self.row_blocks.items():
            if rows < 1 or param.size(0) % rows:
                raise ValueError(f"row blocks of {rows} rows do not divide a matrix of {param.size(0)} rows")

    def orthogonalisation_dtype(self, device: torch.device | str) -> torch.dtype:
        """The dtype the Newton-Schulz products run in for parameters on `device`."""
        return self.ns_dtype or fast_matmul_dtype(device)

    def describe(self, device: torch.device | str, more: str = "") -> str:
        """How the Newton-Schulz steps run, for the run's summary: the precision, the steps, the
        polynomials by the name `muon_ns_coefficients` gives them, the scaling, and `more`."""
        group = self.param_groups[0]
        steps = group["ns_steps"]
        schedule = ns_schedule(group["ns_coefficients"], steps)
        # By name: a resumed run steps with its checkpoint's polynomials.
        name = next((n for n, c in NS_COEFFICIENTS.items() if ns_schedule(c, steps) == schedule), "own")
        scaling = ", scaled by the Gram norm" if self.ns_norm == "gram" else ""
        dtype = str(self.orthogonalisation_dtype(device)).removeprefix("torch.")
        how = f"{steps} Newton-Schulz steps, {name} polynomials{scaling}{more}"
        return f"Muon orthogonalises in {dtype} ({how})"

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params: list[Tensor] = []
            grads: list[Tensor] = []
            buffers: list[Tensor] = []
            self._init_group(group, params, grads, buffers)
            if not params:
                continue
            momentum = group["momentum"]
            torch._foreach_lerp_(buffers, grads, 1 - momentum)
            dtype = self.orthogonalisation_dtype(params[0].device)
            coefficients = ns_schedule(group["ns_coefficients"], group["ns_steps"])
            blocks = [self.row_blocks.get(param) for param in params]
            look_ahead = {"lerp_from": grads, "weight": momentum} if group["nesterov"] else {}
            updates = orthogonalise(
                buffers, coefficients, group["eps"], dtype, blocks, norm=self.ns_norm, **look_ahead
            )
            lr = float(group["lr"])
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
            # One foreach call per step size (a shape's), not one add per parameter: at small
            # shapes the optimizer's per-tensor calls are a visible share of the step.
            by_alpha: dict[float, tuple[list[Tensor], list[Tensor]]] = {}
            for param, update in zip(params, updates, strict=True):
                alpha = -lr * _lr_scale(group["adjust_lr_fn"], param.shape)
                pair = by_alpha.setdefault(alpha, ([], []))
                pair[0].append(param)
                pair[1].append(update)
            for alpha, (group_params, group_updates) in by_alpha.items():
                torch._foreach_add_(group_params, group_updates, alpha=alpha)
        return loss


def _lr_scale(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch's per-shape learning-rate factor, so the update's RMS is alike across shapes."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


Coefficients = tuple[float, float, float]
"""(a, b, c) of one Newton-Schulz step, X <- a X + b A X + c A^2 X with A = X X^T."""

NS_COEFFICIENTS: dict[str, Coefficients | tuple[Coefficients, ...]] = {
    # Keller Jordan's, torch's default: one polynomial for every step, chosen to grow small
    # singular values fast; five steps leave those from 0.003 up (relative to the Frobenius norm)
    # in 0.68-1.20.
    "jordan": (3.4445, -4.7750, 2.0315),
    # One polynomial per step (Amsel et al., "The Polar Express", 2025): each the odd quintic
    # closest to 1 in the worst case over the range of singular values the previous steps left,
    # starting from [0.003, 1], shrunk 1% against rounding. Three steps leave that range in
    # 0.35-1.65, four in 0.79-1.21, five in 0.99-1.01 (tests/training/test_muon.py). Derived by
    # `python benchmarks/ns_coefficients.py`.
    "polar_express": (
        (8.300667, -24.037544, 17.466134),
        (4.005857, -2.925287, 0.542360),
        (3.484016, -2.561413, 0.502365),
        (2.490433, -1.806779, 0.421057),
        (1.910635, -1.276908, 0.367761),
    ),
}


def ns_schedule(coefficients: Coefficients | Sequence[Coefficients], steps: int) -> list[Coefficients]:
    """The (a, b, c) of each of `steps` Newton-Schulz steps: one triple serves every step (torch's
    form, also what a torch Muon checkpoint holds); a sequence of triples gives one per step and
    repeats its last beyond its length."""
    if len(coefficients) == 3 and not isinstance(coefficients[0], Sequence):
        return [tuple(coefficients)] * steps  # type: ignore[list-item]
    per_step = [tuple(c) for c in coefficients]
    return [per_step[min(i, len(per_step) - 1)] for i in range(steps)]  # type: ignore[misc]


def orthogonalise(
    matrices: Sequence[Tensor],
    coefficients: Sequence[Coefficients],
    eps: float,
    dtype: torch.dtype,
    row_blocks: Sequence[int | None] | None = None,
    *,
    lerp_from: Sequence[Tensor] | None = None,
    weight: float = 0.0,
    norm: str = "frobenius",
) -> list[Tensor]:
    """Each matrix's approximate orthogonalisation: one quintic Newton-Schulz step per entry of
    `coefficients` in `dtype`, the same arithmetic as `torch.optim.Muon`'s, on a (N, rows, cols) stack
    per shape. A matrix whose entry in `row_blocks` is a number of rows is cut into blocks of
    that many rows, each orthogonalised as a matrix of its own. `norm` is how each is scaled first
    (`newton_schulz`). Returns the results in the input's order and shapes, in `dtype`.

    With `lerp_from`, what is orthogonalised is `lerp_from[i].lerp(matrices[i], weight)` instead,
    computed straight into the stack: Muon's Nesterov look-ahead (the gradient moved towards the
    momentum) without a tensor of its own per matrix.

    Nothing is transposed or reassembled in memory: a matrix's blocks are consecutive rows, so
    they lie next to each other in the stack and the result is a view of it, and a tall stack
    iterates on X^T X (`newton_schulz`). At small shapes those copies were a tenth of Muon's step."""
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, matrix in enumerate(matrices):
        rows = (row_blocks[i] if row_blocks is not None else None) or matrix.shape[0]
        by_shape.setdefault((rows, matrix.shape[1]), []).append(i)
    done: dict[int, Tensor] = {}
    for (rows, cols), indices in by_shape.items():
        blocks = [matrices[i].reshape(-1, rows, cols) for i in indices]
        # Where each matrix's blocks start in the stack (shape[0], not len(): a tensor's len() is
        # a Python call of its own, and this runs for every matrix at every step).
        starts = [0]
        for block in blocks:
            starts.append(starts[-1] + block.shape[0])
        stack = torch.empty(starts[-1], rows, cols, dtype=dtype, device=blocks[0].device)
        if lerp_from is None:
            torch.cat(blocks, out=stack)  # and into `dtype`
        else:
            same = stack.dtype == blocks[0].dtype
            gathered = stack if same else torch.empty_like(stack, dtype=blocks[0].dtype)
            for i, block, start, end in zip(indices, blocks, starts, starts[1:], strict=False):
                torch.lerp(lerp_from[i].reshape(block.shape), block, weight, out=gathered[start:end])
            if not same:
                stack.copy_(gathered)
        stack = newton_schulz(stack, coefficients, eps, norm)
        for i, start, end in zip(indices, starts, starts[1:], strict=False):
            done[i] = stack[start:end].view(matrices[i].shape)
    return [done[i] for i in range(len(matrices))]


NS_NORMS = ("frobenius", "gram")
"""How `newton_schulz` scales a matrix before its first step (see there)."""


def newton_schulz(
    stack: Tensor, coefficients: Sequence[Coefficients], eps: float, norm: str = "frobenius"
) -> Tensor:
    """X <- a X + (b A + c A^2) X with A = X X^T, on a (N, rows, cols) stack, each matrix first
    scaled so that its spectral norm is at most 1. The singular values move towards 1 (roughly
    into 0.5-1.5 after five steps, as in torch's and Keller Jordan's).

    The scale is a bound on the spectral norm s_1. `norm="frobenius"` divides by the Frobenius
    norm, sqrt(sum s_i^2), as torch does. `norm="gram"` divides by sqrt(||X X^T||_F) =
    (sum s_i^4)^(1/4), which lies between s_1 and the Frobenius norm: every singular value starts
    larger, closer to 1, for the same steps. It costs nothing more: the first step's A is computed
    from X before scaling and scaled with it (measured in docs/results/muon.md).

    A tall stack (rows > cols) takes the same steps on its transpose, written without
    transposing: A = X^T X and X <- a X + X (b A + c A^2). In fp32, matrices at least twice as
    long one way as the other take the same steps on the small Gram matrix instead
    (`_newton_schulz_gram`), which does fewer products."""
    tall = stack.size(-2) > stack.size(-1)
    if norm == "gram":
        # (N, n, n), n the shorter side
        gram = torch.bmm(stack.mT, stack) if tall else torch.bmm(stack, stack.mT)
        scale = torch.linalg.matrix_norm(gram, keepdim=True).clamp(min=eps * eps)
        x, gram = stack / scale.sqrt(), gram.div_(scale)
    elif norm == "frobenius":
        x, gram = stack / torch.linalg.matrix_norm(stack, keepdim=True).clamp(min=eps), None
    else:
        raise ValueError(f"norm must be one of {', '.join(NS_NORMS)}, got {norm!r}")
    if stack.dtype == torch.float32 and max(stack.shape[-2:]) >= 2 * min(stack.shape[-2:]):
        return _newton_schulz_gram(x, coefficients, tall, gram)
    for a, b, c in coefficients:
        if gram is None:
            gram = torch.bmm(x.mT, x) if tall else torch.bmm(x, x.mT)
        polynomial = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, x, polynomial, beta=a) if tall else torch.baddbmm(x, polynomial, x, beta=a)
        gram = None
    return x


def _newton_schulz_gram(
    x: Tensor, coefficients: Sequence[Coefficients], tall: bool, gram: Tensor | None = None
) -> Tensor:
    """The same iteration, carried out on (n x n) matrices only, n the shorter side (here as for
    a wide X; a tall one is its transpose).

    Each step multiplies X by P = a I + b A + c A^2, a polynomial in A = X X^T, so after k steps
    X_k = Q_k X_0 with Q_k = P_k ... P_1, and A_{k+1} = P_k A_k P_k: every P, Q and A commute.
    Iterating on A and Q costs about 4 rows^3 a step instead of 2 rows^2 cols + rows^3, plus
    2 rows^2 cols once (A_0 and Q X_0): fewer FLOPs for a wide X. In bf16 the repeated products
    of A drift, so bf16 keeps the direct iteration. `gram` is A_0 where the caller has it."""
    if gram is None:
        gram = torch.bmm(x.mT, x) if tall else torch.bmm(x, x.mT)  # (N, n, n)
    product = None
    steps = len(coefficients)
    for step, (a, b, c) in enumerate(coefficients):
        polynomial = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        polynomial.diagonal(dim1=-2, dim2=-1).add_(a)
        # bmm, not @: matmul's checks and reshapes of 3-d operands cost as much as these small products
        product = polynomial if product is None else torch.bmm(polynomial, product)
        if step < steps - 1:
            gram = torch.bmm(polynomial, torch.bmm(gram, polynomial))
    assert product is not None
    return torch.bmm(x, product) if tall else torch.bmm(product, x)  # Q is symmetric: (Q X^T)^T = X Q
