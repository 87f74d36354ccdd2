import pytest
import torch
from torch.testing import assert_close

from minigpt.training.loss import fused_linear_cross_entropy, next_token_loss


def reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return next_token_loss(hidden @ weight.T, targets)


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 1000])
def test_matches_full_logits_in_value_and_gradients(chunk_rows: int) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(3, 21, 16, requires_grad=True)
    weight = torch.randn(300, 16, requires_grad=True)
    targets = torch.randint(0, 300, (3, 21))
    fused = fused_linear_cross_entropy(hidden, weight, targets, chunk_rows=chunk_rows)
    full = reference(hidden, weight, targets)
    assert_close(fused, full)
    # A non-unit upstream gradient checks that backward scales by it.
    grads_fused = torch.autograd.grad(2.5 * fused, [hidden, weight])
    grads_full = torch.autograd.grad(2.5 * full, [hidden, weight])
    for a, b in zip(grads_fused, grads_full, strict=True):
        assert_close(a, b)


def test_under_bf16_autocast_stays_close_to_fp32() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(4, 16, 32, requires_grad=True)
    weight = (0.1 * torch.randn(500, 32)).requires_grad_()
    targets = torch.randint(0, 500, (4, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = fused_linear_cross_entropy(hidden, weight, targets, chunk_rows=16)
    assert fused.dtype == torch.float32
    full = reference(hidden, weight, targets)
    assert_close(fused, full, atol=2e-2, rtol=1e-2)
    grad_h, grad_w = torch.autograd.grad(fused, [hidden, weight])
    ref_h, ref_w = torch.autograd.grad(full, [hidden, weight])
    assert grad_h.dtype == hidden.dtype and grad_w.dtype == weight.dtype
    assert_close(grad_h, ref_h, atol=2e-3, rtol=5e-2)
    assert_close(grad_w, ref_w, atol=2e-3, rtol=5e-2)


def test_no_grad_evaluation_gives_the_same_loss() -> None:
    torch.manual_seed(0)
    hidden, weight = torch.randn(2, 5, 8), torch.randn(50, 8)
    targets = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        assert_close(
            fused_linear_cross_entropy(hidden, weight, targets, 3), reference(hidden, weight, targets)
        )


def test_a_perfect_prediction_has_near_zero_loss() -> None:
    weight = torch.eye(5) * 50.0
    hidden = torch.eye(5)[None]  # (1, 5, 5): token i predicts token i with certainty
    loss = fused_linear_cross_entropy(hidden, weight, torch.arange(5)[None], chunk_rows=2)
    assert loss.item() < 1e-6


@pytest.mark.parametrize("chunk_rows", [1, 5, 1000])
def test_ignored_targets_leave_the_mean_and_the_gradients_as_full_logits_do(chunk_rows: int) -> None:
    """A chat's targets outside the assistant's turns are -100: neither loss reads an id there,
    and both are the mean over the other targets."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 9, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 50, (2, 9))
    targets[0, :4] = targets[1, 6:] = -100
    fused = fused_linear_cross_entropy(hidden, weight, targets, chunk_rows=chunk_rows)
    kept = targets != -100
    assert_close(fused, torch.nn.functional.cross_entropy((hidden @ weight.T)[kept], targets[kept]))
    full = reference(hidden, weight, targets)
    assert_close(fused, full)
    for a, b in zip(
        torch.autograd.grad(fused, [hidden, weight]), torch.autograd.grad(full, [hidden, weight]), strict=True
    ):
        assert_close(a, b)
