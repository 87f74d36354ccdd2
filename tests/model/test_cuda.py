"""The model on a CUDA GPU: bf16 autocast against fp32, and SDPA's kernels against the explicit path.

Skipped where torch sees no CUDA device; everything else in tests/ runs on the CPU or picks the
device as the user's machine would.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minigpt.model import GPT, GPTConfig, MultiHeadAttention
from minigpt.training.loss import next_token_loss

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CONFIG = GPTConfig(
    vocab_size=512,
    context_length=128,
    n_layer=2,
    n_head=4,
    n_embd=128,
    qkv_bias=True,
    gelu_approximate="tanh",
)
"""gpt2-124m.yaml's layout (qkv bias, tanh GELU) at a size that runs in a moment."""


@pytest.fixture(autouse=True)
def exact_fp32_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 references in fp32, not TF32 (10-bit products), whatever an earlier test chose."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """‖actual - reference‖ / ‖reference‖, in fp32."""
    return ((actual.float() - reference.float()).norm() / reference.float().norm()).item()


def loss_and_grads(
    model: GPT, ids: torch.Tensor, bf16: bool
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Logits, loss and every parameter's gradient of one training forward and backward."""
    x, y = ids[:, :-1], ids[:, 1:]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        logits = model(x)
    loss = next_token_loss(logits, y)
    names, params = zip(*model.named_parameters(), strict=True)
    grads = torch.autograd.grad(loss, params)
    return logits, loss, dict(zip(names, grads, strict=True))


def ids_for(config: GPTConfig, batch: int = 4) -> torch.Tensor:
    assert config.vocab_size is not None
    return torch.randint(config.vocab_size, (batch, config.context_length + 1), device="cuda")


def assert_grads_close(
    actual: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], tol: float
) -> None:
    for name, grad in reference.items():
        if name.endswith("W_key.bias"):
            continue  # zero in exact arithmetic (softmax ignores a shift shared by every key): rounding alone
        assert relative_error(actual[name], grad) < tol, name


def test_bf16_autocast_forward_and_backward_match_fp32() -> None:
    """bf16-mixed, as gpt2-124m.yaml trains: logits, loss and gradients within bf16's rounding
    (8 bits, ~0.4% per rounding) of the fp32 step's."""
    torch.manual_seed(0)
    model = GPT(CONFIG).cuda()
    ids = ids_for(CONFIG)
    ref_logits, ref_loss, ref_grads = loss_and_grads(model, ids, bf16=False)
    logits, loss, grads = loss_and_grads(model, ids, bf16=True)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert relative_error(logits, ref_logits) < 0.02
    assert abs(loss.item() - ref_loss.item()) < 0.01 * ref_loss.item()
    assert_grads_close(grads, ref_grads, tol=0.03)


def test_auto_attention_takes_sdpa_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k)
    )
    MultiHeadAttention(32, 32, 16, 0.0, num_heads=4).cuda()(torch.randn(2, 16, 32, device="cuda"))
    assert calls == [1]


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_sdpa_and_the_explicit_path_agree(bf16: bool) -> None:
    """The same weights through SDPA's CUDA kernels (flash under bf16) and the explicit
    computation: the same logits and gradients, in fp32 to fp32's rounding, in bf16 each within
    bf16's rounding of the fp32 result."""
    torch.manual_seed(0)
    explicit = GPT(dataclasses.replace(CONFIG, attention="explicit")).cuda()
    fused = GPT(dataclasses.replace(CONFIG, attention="sdpa")).cuda()
    fused.load_state_dict(explicit.state_dict())
    ids = ids_for(CONFIG)
    ref_logits, _, ref_grads = loss_and_grads(explicit, ids, bf16=False)
    if not bf16:
        logits, _, grads = loss_and_grads(fused, ids, bf16=False)
        assert relative_error(logits, ref_logits) < 1e-5
        assert_grads_close(grads, ref_grads, tol=1e-4)
        return
    for model in (fused, explicit):
        logits, _, grads = loss_and_grads(model, ids, bf16=True)
        assert relative_error(logits, ref_logits) < 0.02
        assert_grads_close(grads, ref_grads, tol=0.03)
