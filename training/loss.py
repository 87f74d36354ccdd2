"""Next-token cross-entropy that never materialises the full (B*T, V) logits tensor.

With a 50k vocabulary the output layer is most of a small model's work, and its fp32 logits for
a batch take hundreds of MB: writing, casting and re-reading them costs more than the matmul.
`fused_linear_cross_entropy` projects a chunk of rows at a time, takes the loss and its gradient
in the same pass (as Liger-Kernel's fused linear cross-entropy does), and keeps only the
gradients, so memory traffic stays cache-sized.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minigpt.data.chat.conversations import IGNORE_INDEX


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits (B, T, V) against target ids (B, T), computed in fp32, over the
    targets that are not IGNORE_INDEX (a chat's turns other than the assistant's, and padding)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)


def token_losses(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int | None = None
) -> torch.Tensor:
    """Cross-entropy of every position, fp32 `(N,)`, for hidden states (..., C), the LM head's
    weight (V, C) and targets (...): what validation sums; 0 where a target is IGNORE_INDEX. With
    `chunk_rows`, the logits of that many rows at a time, as `fused_linear_cross_entropy` takes
    them; without, all at once."""
    hidden, targets = hidden.flatten(0, -2), targets.flatten()
    step = chunk_rows or max(hidden.shape[0], 1)
    losses = [
        F.cross_entropy(
            F.linear(hidden[i : i + step], weight).float(),
            targets[i : i + step],
            reduction="none",
            ignore_index=IGNORE_INDEX,
        )
        for i in range(0, hidden.shape[0], step)
    ]
    return torch.cat(losses) if losses else hidden.new_zeros(0, dtype=torch.float32)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int):
        dtype = _compute_dtype(hidden)
        n = hidden.shape[0]
        kept = targets != IGNORE_INDEX  # (N,): the rows the mean is over
        count = kept.sum()
        targets = targets.masked_fill(~kept, 0)  # any id: their rows add nothing
        h, w = hidden.to(dtype), weight.to(dtype)
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if needs_grad else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if needs_grad else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk_rows):
            rows = slice(start, min(start + chunk_rows, n))
            logits = (h[rows] @ w.T).float()  # (chunk, V)
            target, keep = targets[rows], kept[rows]
            lse = torch.logsumexp(logits, dim=-1)
            total += ((lse - logits.gather(1, target[:, None]).squeeze(1)) * keep).sum()
            if needs_grad:
                # d(mean loss)/d(logits) = (softmax - onehot) / count on a kept row, 0 on the others.
                grad_logits = logits.sub_(lse[:, None]).exp_()
                grad_logits[torch.arange(grad_logits.shape[0], device=target.device), target] -= 1.0
                grad_logits = grad_logits.mul_((keep / count)[:, None]).to(dtype)
                grad_h[rows] = grad_logits @ w
                grad_w += (grad_logits.T @ h[rows]).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.input_dtypes = (hidden.dtype, weight.dtype)
        return total / count

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.input_dtypes
        return (
            (grad_h * grad_output).to(h_dtype) if ctx.needs_input_grad[0] else None,
            (grad_w * grad_output).to(w_dtype) if ctx.needs_input_grad[1] else None,
            None,
            None,
        )


def fused_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int = 256
) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` against `targets`, chunk by chunk.

    hidden (..., C), weight (V, C), targets (...) of ids, IGNORE_INDEX where a row is left out of
    the mean. Equals `next_token_loss(hidden @ weight.T, targets)` in value and gradients. Under autocast the
    matmuls run in the autocast dtype; the softmax is always fp32.
    """
    return _FusedLinearCrossEntropy.apply(hidden.flatten(0, -2), weight, targets.flatten(), chunk_rows)
