"""The fast paths against their eager references: each hand-written node computes its
reference's function, forward and backward, and falls back to the reference where it is not taken."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from minigpt.model.fast import (
    _NormaliseRotate,
    _one_node,
    _RMSNormalise,
    _rotate,
    normalise_and_rotate,
    normalise_and_rotate_reference,
    rms_normalise,
    rms_normalise_reference,
    squared_relu,
    squared_relu_reference,
)
from minigpt.model.rotary import RotaryEmbedding, swap_halves


def test_qk_norms_written_out_gradient_is_torchs_rms_norm() -> None:
    """QK-norm's fp32 path (forward and gradient by hand) against F.rms_norm, a zero vector
    included, and its gradient against finite differences in float64."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 8, 16) * 3
    x[0, 0, 0, 0] = 0.0
    grad = torch.randn_like(x)
    ours, torchs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, reference = rms_normalise(ours), rms_normalise_reference(torchs)
    out.backward(grad)
    reference.backward(grad)
    assert_close(out, reference, rtol=1e-6, atol=1e-6)
    assert_close(ours.grad, torchs.grad, rtol=1e-5, atol=1e-6)
    double = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_RMSNormalise.apply, double)
    bf16 = x.bfloat16()  # bf16 takes torch's own
    assert torch.equal(rms_normalise(bf16), torch.nn.functional.rms_norm(bf16, (16,)))


def test_qk_norm_and_rotation_in_one_node_match_the_two_apart() -> None:
    """The fp32 node that normalises and rotates together (forward, and a backward written out)
    against F.rms_norm then the rotation through autograd, at a start past 0, a zero vector and
    a non-contiguous input (the projection's view) included; and its gradient against finite
    differences in float64."""
    torch.manual_seed(0)
    rotary = RotaryEmbedding(head_dim=16, context_length=32)
    projected = torch.randn(2, 8, 3, 4, 16) * 3  # (B, T, 3, nh, hs), as attention's projection
    projected[0, 0, 0, 0] = 0.0
    ours, torchs = projected.clone().requires_grad_(), projected.clone().requires_grad_()
    grad = torch.randn(2, 2, 4, 8, 16)
    out = normalise_and_rotate(ours.permute(2, 0, 3, 1, 4)[:2], rotary, 5)
    reference = normalise_and_rotate_reference(torchs.permute(2, 0, 3, 1, 4)[:2], rotary, 5)
    out.backward(grad)
    reference.backward(grad)
    assert_close(out, reference, rtol=1e-6, atol=1e-6)
    assert_close(ours.grad, torchs.grad, rtol=1e-5, atol=1e-5)
    double = RotaryEmbedding(head_dim=8, context_length=16).double()
    x = torch.randn(2, 3, 6, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: _NormaliseRotate.apply(v, *double.tables(v, 2)), x)


def test_in_bf16_on_a_cpu_the_node_computes_in_fp32_and_rounds_once() -> None:
    """bf16 on a CPU takes the node too: its output and gradient are the fp32 node's on the
    widened input, rounded to bf16 once, and within bf16's rounding of the two apart (F.rms_norm,
    then the rotation, each rounding to bf16). fp16, other devices and compiled models keep the
    two apart."""
    torch.manual_seed(0)
    rotary = RotaryEmbedding(head_dim=16, context_length=32)
    projected = (torch.randn(2, 8, 3, 4, 16) * 3).bfloat16()
    ours, wide, apart = (projected.clone().requires_grad_() for _ in range(3))
    wide_grad = torch.randn(2, 2, 4, 8, 16)
    out = normalise_and_rotate(ours.permute(2, 0, 3, 1, 4)[:2], rotary, 5)
    reference = normalise_and_rotate(wide.float().permute(2, 0, 3, 1, 4)[:2], rotary, 5)
    two = normalise_and_rotate_reference(apart.permute(2, 0, 3, 1, 4)[:2], rotary, 5)
    assert out.dtype == torch.bfloat16 and torch.equal(out, reference.bfloat16())
    assert_close(out.float(), two.float(), rtol=0, atol=0.04)  # ~bf16's rounding at values up to ~2
    out.backward(wide_grad.bfloat16())
    reference.backward(wide_grad.bfloat16().float())
    two.backward(wide_grad.bfloat16())
    assert ours.grad.dtype == torch.bfloat16 and torch.equal(ours.grad, wide.grad)
    assert_close(ours.grad.float(), apart.grad.float(), rtol=0.02, atol=0.02)
    assert _one_node(projected) and not _one_node(projected.half())
    assert not _one_node(torch.empty(2, 16, dtype=torch.bfloat16, device="meta"))


def test_where_no_node_is_taken_the_fast_paths_are_their_references() -> None:
    torch.manual_seed(0)
    rotary = RotaryEmbedding(head_dim=16, context_length=32)
    x = (torch.randn(2, 4, 8, 16) * 3).half()
    assert torch.equal(normalise_and_rotate(x, rotary, 3), normalise_and_rotate_reference(x, rotary, 3))
    assert torch.equal(rms_normalise(x), rms_normalise_reference(x))


def test_the_rotation_by_halves_is_the_full_width_rotation_bit_for_bit_and_contiguous() -> None:
    """The node rotates a half at a time: the numbers of the full-width form (a product, the
    swapped copy, one addcmul), forward and back, into a contiguous tensor whatever the input's
    layout (the attention's queries and keys then reshape without a copy)."""
    torch.manual_seed(0)
    rotary = RotaryEmbedding(head_dim=32, context_length=64)
    x = torch.randn(3, 64, 3, 4, 32).permute(2, 0, 3, 1, 4)[:2]  # the projection's view
    cos, sin = rotary.tables(x, 0)
    forward, back = _rotate(x, cos, sin), _rotate(x, cos, sin, back=True)
    assert torch.equal(forward, torch.addcmul(x * cos, swap_halves(x), sin))
    assert torch.equal(back, torch.addcmul(x * cos, swap_halves(x), sin, value=-1))
    assert forward.is_contiguous() and back.is_contiguous()
    assert_close(_rotate(forward, cos, sin, back=True), x)  # R^T R = I


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_squared_relu_has_autograds_numbers_bit_for_bit(dtype: torch.dtype) -> None:
    """Its hand-written gradient is a speed-up, not a change: forward and backward equal what
    autograd makes of torch.relu(x).square(), zeros and negative inputs included."""
    x = torch.randn(3, 5, 64).to(dtype)
    x[0, 0, :4] = torch.tensor([0.0, -0.0, -1.0, 1.0])
    grad = torch.randn_like(x)
    ours, autograds = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = squared_relu(ours)
    reference = squared_relu_reference(autograds)
    out.backward(grad)
    reference.backward(grad)
    assert out.dtype == dtype and torch.equal(out, reference)
    assert torch.equal(ours.grad, autograds.grad)
