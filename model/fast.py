"""Fast paths beside their eager references: autograd nodes whose gradients are written out.

At a small model's shapes an elementwise step costs what its passes over memory cost, not its
arithmetic, and autograd's general rules take more passes than these functions need. Each fast
path computes its reference's function, and falls back to the reference where its node does not
pay; the model calls the fast path by name. tests/model/test_fast.py holds each to its reference,
and docs/results/fast-paths.md gives what each saves.

| fast path | eager reference |
|---|---|
| `rms_normalise(x)` (QK-norm) | `F.rms_norm(x, (x.size(-1),))` |
| `normalise_and_rotate(x, rotary, start)` | `rotary(F.rms_norm(x, (x.size(-1),)), start)` |
| `squared_relu(x)` | `torch.relu(x).square()` |
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .rotary import RotaryEmbedding


def rms_normalise_reference(x: torch.Tensor) -> torch.Tensor:
    """x over the root mean square of its last dimension, without a gain: torch's own."""
    return F.rms_norm(x, (x.size(-1),))


def normalise_and_rotate_reference(
    x: torch.Tensor, rotary: RotaryEmbedding, start: int, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """QK-norm, then the rotation by position, as two autograd nodes."""
    return rotary(rms_normalise_reference(x), start, positions)


def squared_relu_reference(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2 through autograd."""
    return torch.relu(x).square()


def rms_normalise(x: torch.Tensor) -> torch.Tensor:
    """QK-norm: `rms_normalise_reference(x)`, within fp32's rounding. In eager fp32 the gradient is
    written out (`_RMSNormalise`) because it takes three passes over x backward where autograd's
    composite takes six; elsewhere the reference."""
    if _written_out(x):
        return _RMSNormalise.apply(x)
    return rms_normalise_reference(x)


def normalise_and_rotate(
    x: torch.Tensor, rotary: RotaryEmbedding, start: int, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """QK-norm then the rotation: `normalise_and_rotate_reference(x, rotary, start, positions)`'s
    function (`positions`, (B, T), places each token of an x of (..., B, nh, T, hs) on its own).
    In eager fp32, and in bf16 on a CPU, one autograd node does both (`_NormaliseRotate`) because
    one backward over the queries and keys costs less than two. On GPUs in bf16 or fp16, and when
    compiled, the reference: there the node did not pay for a path of its own."""
    if _one_node(x):
        return _NormaliseRotate.apply(x, *rotary.tables(x, start, torch.float32, positions))
    return normalise_and_rotate_reference(x, rotary, start, positions)


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    """`squared_relu_reference(x)`, bit for bit, with its gradient written out (`_SquaredReLU`)
    because it takes three passes over the MLP's widest tensor where autograd takes more than five."""
    return _SquaredReLU.apply(x)


def _one_node(x: torch.Tensor) -> bool:
    """Whether QK-norm and the rotation run as `_NormaliseRotate` (eager fp32, or bf16 on a CPU)."""
    if torch.compiler.is_compiling():
        return False
    return x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and x.device.type == "cpu")


def _written_out(x: torch.Tensor) -> bool:
    """Whether QK-norm takes the gradients written out here (fp32, eager) rather than autograd's."""
    return x.dtype == torch.float32 and not torch.compiler.is_compiling()


def _rms_scale(x: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(mean(x^2) + eps) over the last dimension, eps x's dtype's as in `F.rms_norm`."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return norm.square_().div_(x.size(-1)).add_(torch.finfo(x.dtype).eps).rsqrt_()


def _rms_gradient(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """g - y mean(g y): the RMS norm's gradient before the scale, y its output."""
    along = (grad * y).mean(-1, keepdim=True)
    return torch.addcmul(grad, y, along, value=-1)


class _RMSNormalise(torch.autograd.Function):
    """y = x r with r = 1 / sqrt(mean(x^2) + eps) over the last dimension, eps fp32's as in
    `F.rms_norm`; the gradient is r (g - y mean(g y))."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        scale = _rms_scale(x)
        y = x * scale
        ctx.save_for_backward(y, scale)
        return y

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        y, scale = ctx.saved_tensors
        return _rms_gradient(grad, y).mul_(scale)


class _NormaliseRotate(torch.autograd.Function):
    """y = R(x r), r = 1 / sqrt(mean(x^2) + eps) over the last dimension and R the rotation
    x * cos + swap_halves(x) * sin. R is orthogonal and commutes with the scalar r, so the gradient
    is r R^T (g - y mean(g y)): the RMS norm's gradient, rotated back by R^T u = u * cos -
    swap_halves(u) * sin.

    It computes in fp32 (the tables are fp32; a float64 x stays float64): a bf16 x is widened once,
    and the output and the gradient are rounded to bf16 once, at the end, where `F.rms_norm` (which
    also computes in fp32, eps fp32's) and the rotation in bf16 round after every step."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16 widened; fp32 (or fp64) as it is
        scale = _rms_scale(wide)
        y = _rotate(wide * scale, cos, sin)
        ctx.save_for_backward(y, scale, cos, sin)
        return y.to(x.dtype)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None, None]:
        y, scale, cos, sin = ctx.saved_tensors
        u = _rms_gradient(grad.to(y.dtype), y)
        return _rotate(u, cos, sin, back=True).mul_(scale).to(grad.dtype), None, None


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, back: bool = False) -> torch.Tensor:
    """R x = x * cos + swap_halves(x) * sin (R^T x = x * cos - swap_halves(x) * sin with `back`), a
    half at a time into a new contiguous tensor: (x1 c - x2 s, x2 c + x1 s) in four calls over
    halves, where the full width takes a product, a swapped copy and a sum. The numbers are those
    of `torch.addcmul(x * cos, swap_halves(x), sin)` bit for bit. Contiguous, the queries and keys
    reshape into the attention's batched products without a copy."""
    half = x.size(-1) // 2
    c, s = cos[..., :half], sin[..., half:]  # the signed sine table's second half is +sin
    x1, x2 = x[..., :half], x[..., half:]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y1, y2 = y[..., :half], y[..., half:]
    sign = 1 if back else -1
    torch.mul(x1, c, out=y1).addcmul_(x2, s, value=sign)
    torch.mul(x2, c, out=y2).addcmul_(x1, s, value=-sign)
    return y


class _SquaredReLU(torch.autograd.Function):
    """relu(x)^2 with its gradient 2 relu(x) g written out: relu and the product forward, one
    addcmul backward, where autograd runs pow's general backward and then relu's. The same numbers
    as autograd's `torch.relu(x).square()`."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        positive = torch.relu(x)
        ctx.save_for_backward(positive)
        return positive * positive  # a multiplication: square() goes through pow

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (positive,) = ctx.saved_tensors
        # 0 + 2 positive grad, in one pass: addcmul's broadcast zero is the only way to
        # multiply three factors in one kernel.
        return torch.addcmul(positive.new_zeros(()), positive, grad, value=2)
