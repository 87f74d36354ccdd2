"""LitGPT inside a real Trainer, in-process, on a tiny character corpus."""

from __future__ import annotations

import getpass
import tempfile
from dataclasses import replace
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.testing import assert_close

from minigpt.data import DataConfig, TextDataModule
from minigpt.model import GPT as Network
from minigpt.model import ConfigError, GPTConfig
from minigpt.training.config import OptimConfig
from minigpt.training.lit import LitGPT

GPT = GPTConfig(context_length=32, n_layer=1, n_head=2, n_embd=32)


def datamodule(corpus: Path, tmp_path: Path) -> TextDataModule:
    config = DataConfig(source=str(corpus), tokenizer="char", cache_dir=str(tmp_path / "cache"), batch_size=8)
    return TextDataModule(config, context_length=GPT.context_length)


def global_norm(tensors: list[torch.Tensor]) -> float:
    return torch.linalg.vector_norm(torch.stack([t.norm() for t in tensors])).item()


class ClippingRecord(L.Callback):
    """At each optimizer step: the global gradient norm backward left, the one the gradients have
    after the step, the `grad_norm` LitGPT logged, and how far AdamW's first moment is from having
    taken the gradients as they are after the step (m = beta1 m_previous + (1 - beta1) g)."""

    def __init__(self) -> None:
        self.raw: list[float] = []
        self.after: list[float] = []
        self.logged: list[float] = []
        self.moment_errors: list[float] = []
        self._previous: dict[torch.Tensor, torch.Tensor] = {}

    def on_after_backward(self, trainer, pl_module) -> None:
        self.raw.append(global_norm([p.grad for p in pl_module.parameters()]))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        optimizer = trainer.optimizers[0]
        (beta1, _), differences, expectations = optimizer.param_groups[0]["betas"], [], []
        for p in pl_module.parameters():
            moment = optimizer.state[p]["exp_avg"]
            expected = beta1 * self._previous.get(p, torch.zeros_like(p)) + (1 - beta1) * p.grad
            differences.append(moment - expected)
            expectations.append(expected)
            self._previous[p] = moment.clone()
        self.moment_errors.append(global_norm(differences) / global_norm(expectations))
        self.after.append(global_norm([p.grad for p in pl_module.parameters()]))
        self.logged.append(float(trainer.callback_metrics["grad_norm"]))


def test_bf16_mixed_with_fused_adamw_steps_with_the_clipped_gradient(corpus: Path, tmp_path: Path) -> None:
    record = ClippingRecord()
    lit = LitGPT(GPT, OptimConfig(lr=1e-2, grad_clip=0.05, fused=True))
    trainer = L.Trainer(
        max_steps=5,
        precision="bf16-mixed",
        accelerator="cpu",
        logger=False,
        callbacks=[record],
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        log_every_n_steps=1,  # grad_norm is logged on the steps whose logs are kept
        default_root_dir=tmp_path,
    )
    trainer.fit(lit, datamodule=datamodule(corpus, tmp_path))
    assert trainer.global_step == len(record.raw) == 5
    assert min(record.raw) > 0.05  # every step's gradient was larger than the limit
    # AdamW stepped with the gradients as clipping left them (float32 rounding of the blend: ~1e-7)...
    assert max(record.moment_errors) < 1e-5
    # ...which have the limit's norm (clip_grad_norm_ scales by 0.05 / (norm + 1e-6): 2e-5 from it).
    assert record.after == pytest.approx([0.05] * 5, rel=1e-4)
    # The logged grad_norm is the norm before clipping (the same sum of squares, in another order).
    assert record.logged == pytest.approx(record.raw, rel=1e-5)


class StepRecord(L.Callback):
    """The gradient norm LitGPT measured (before clipping) and the learning rate, at each optimizer step."""

    def __init__(self) -> None:
        self.norms: list[float] = []
        self.lrs: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches == 0:
            self.norms.append(float(pl_module.grad_norm))
            self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def test_two_accumulated_batches_of_4_train_as_one_batch_of_8(corpus: Path, tmp_path: Path) -> None:
    """The same 8 windows per optimizer step either way: the loss must be averaged over the two
    micro-batches, and clipping and the schedule applied once per optimizer step, not per batch."""
    runs = []
    for batch_size, accumulate in ((8, 1), (4, 2)):
        config = DataConfig(
            source=str(corpus), tokenizer="char", cache_dir=str(tmp_path / "cache"), batch_size=batch_size
        )
        record = StepRecord()
        torch.manual_seed(0)
        lit = LitGPT(GPT, OptimConfig(lr=1e-2, min_lr=1e-3, warmup_steps=2, grad_clip=0.5))
        trainer = L.Trainer(
            max_steps=4,
            accumulate_grad_batches=accumulate,
            accelerator="cpu",
            logger=False,
            callbacks=[record],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            default_root_dir=tmp_path,
        )
        trainer.fit(lit, datamodule=TextDataModule(config, context_length=GPT.context_length))
        assert trainer.global_step == 4
        runs.append((record, lit.model.state_dict()))
    (whole, whole_weights), (accumulated, accumulated_weights) = runs
    assert accumulated.lrs == pytest.approx(whole.lrs, rel=1e-6) and len(set(whole.lrs)) == 4
    assert accumulated.norms == pytest.approx(whole.norms, rel=1e-4)
    assert max(whole.norms) > 0.5  # clipping was at work
    for key, value in whole_weights.items():
        assert_close(accumulated_weights[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_fused_and_plain_loss_agree(corpus: Path, tmp_path: Path) -> None:
    data = datamodule(corpus, tmp_path)
    data.prepare_data()
    data.setup("fit")
    x, y = next(iter(data.train_dataloader()))
    net = Network(replace(GPT, vocab_size=data.vocab_size))
    fused, plain = LitGPT(GPT, fused_loss=True), LitGPT(GPT, fused_loss=False)
    fused.model = plain.model = net
    assert_close(fused.loss(x, y), plain.loss(x, y))


@pytest.mark.slow  # torch.compile runs a C++ compiler
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_compiled_step_gives_the_eager_loss_and_gradients(
    precision: str, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inductor's cache does not key its kernels on ATen's CPU capability: kernels built in a normal
    # process, reused in one held to AVX2 (ATEN_CPU_CAPABILITY=avx2, how the suite is run as a CPU
    # without native bf16), gave NaN. A cache per capability keeps both runs honest and warm.
    capability = torch.backends.cpu.get_cpu_capability().lower()
    cache = Path(tempfile.gettempdir()) / f"minigpt-inductor-{getpass.getuser()}-{capability}"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    data = datamodule(corpus, tmp_path)
    data.prepare_data()
    data.setup("fit")
    x, y = next(iter(data.train_dataloader()))
    torch.manual_seed(0)
    # The modern recipe: every fast path the compiled region replaces (QK-norm, rotation, squared ReLU).
    recipe = replace(
        GPT, vocab_size=data.vocab_size, position_embedding="rope", qk_norm=True, activation="relu2"
    )
    net = Network(recipe)
    compiled, eager = LitGPT(recipe, compile=True), LitGPT(recipe)
    compiled.model = eager.model = net
    losses, grads = [], []
    for lit in (compiled, eager):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = lit.loss(x, y)
        losses.append(loss)
        grads.append(torch.autograd.grad(loss, list(net.parameters())))
    # One compiled region from token ids to the loss: the head and the cross-entropy inside it.
    assert eager._step_loss == eager._plain_loss
    assert compiled._step_loss != compiled._plain_loss
    assert compiled._features is None  # the blocks were not compiled on their own
    tolerance = {"fp32": {"atol": 1e-5, "rtol": 1e-4}, "bf16": {"atol": 2e-2, "rtol": 2e-2}}[precision]
    assert_close(losses[0], losses[1], **tolerance)
    for a, b in zip(*grads, strict=True):
        assert_close(a, b, **tolerance)


def test_vocab_smaller_than_the_tokenizer_is_refused(corpus: Path, tmp_path: Path) -> None:
    lit = LitGPT(replace(GPT, vocab_size=3))
    trainer = L.Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    with pytest.raises(ConfigError, match="smaller than the tokenizer"):
        trainer.fit(lit, datamodule=datamodule(corpus, tmp_path))
