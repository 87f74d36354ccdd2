"""EMAWeights: the average it keeps, what validation and checkpoints see, resuming, bad settings."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.testing import assert_close

from minigpt.cli.generate import generate_main
from minigpt.cli.train import train_main
from minigpt.data import DataConfig, TextDataModule
from minigpt.model import ConfigError, GPTConfig
from minigpt.training.callbacks.averaging import EMAWeights, MovingAverage
from minigpt.training.config import OptimConfig
from minigpt.training.lit import LitGPT

from .conftest import tiny_args

GPT = GPTConfig(context_length=16, n_layer=1, n_head=2, n_embd=16)


class RawWeights(L.Callback):
    """The weights the optimizer left after each step, and what validation ran on."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []
        self.validated: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps.append({n: p.detach().clone() for n, p in pl_module.named_parameters()})

    def on_validation_end(self, trainer, pl_module) -> None:  # where SampleText draws its sample
        self.validated.append({n: p.detach().clone() for n, p in pl_module.named_parameters()})


def fit(
    corpus: Path,
    tmp_path: Path,
    max_steps: int,
    *callbacks: L.Callback,
    ckpt_path: str | None = None,
    optim: OptimConfig = OptimConfig(lr=3e-2, warmup_steps=0),
):
    L.seed_everything(0)
    lit = LitGPT(GPT, optim)
    data = DataConfig(source=str(corpus), tokenizer="char", cache_dir=str(tmp_path / "cache"), batch_size=4)
    trainer = L.Trainer(
        max_steps=max_steps,
        val_check_interval=3,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        accelerator="cpu",
        logger=False,
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(lit, datamodule=TextDataModule(data, context_length=GPT.context_length), ckpt_path=ckpt_path)
    return lit


def test_the_average_is_the_ema_of_each_step_s_weights_and_validation_runs_on_it(
    corpus: Path, tmp_path: Path
) -> None:
    raw = RawWeights()
    lit = fit(corpus, tmp_path, 6, raw, EMAWeights(decay=0.8))
    expected = raw.steps[0]  # the average starts as the weights after the first step
    averages = [expected]
    for weights in raw.steps[1:]:
        expected = {n: 0.8 * expected[n] + 0.2 * weights[n] for n in expected}
        averages.append(expected)
    assert len(raw.validated) == 2  # after steps 3 and 6
    for validated, average in zip(raw.validated, (averages[2], averages[5]), strict=True):
        for name, value in validated.items():
            assert_close(value, average[name], msg=name)
    final = dict(lit.named_parameters())
    for name, value in averages[-1].items():  # the run ends with the average in the model
        assert_close(final[name].detach(), value, msg=name)
        assert not torch.equal(value, raw.steps[-1][name]) or "ln_" in name


def test_checkpoints_hold_the_average_and_resume_the_raw_weights(corpus: Path, tmp_path: Path) -> None:
    raw = RawWeights()
    every_3 = L.pytorch.callbacks.ModelCheckpoint(every_n_train_steps=3, save_top_k=-1, filename="{step}")
    straight = fit(corpus, tmp_path / "straight", 6, raw, EMAWeights(decay=0.8), every_3)
    saved = tmp_path / "straight" / "checkpoints" / "step=3.ckpt"
    checkpoint = torch.load(saved, weights_only=False)
    averaged, current = checkpoint["state_dict"], checkpoint["current_model_state"]
    for name, value in raw.validated[0].items():
        assert_close(averaged[name], value, msg=name)
    for name, value in raw.steps[2].items():
        assert_close(current[name], value, msg=name)

    resumed = fit(corpus, tmp_path / "resumed", 6, EMAWeights(decay=0.8), ckpt_path=str(saved))
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        assert_close(a, b, msg=name)  # the average after step 6, either way


def test_a_run_that_ends_between_validations_saves_its_raw_weights_to_resume_from(
    corpus: Path, tmp_path: Path
) -> None:
    """`last` written at the end of a run (no validation at its last step) resumes the raw weights:
    the run continued to more steps is the run that had them from the start."""
    constant = OptimConfig(lr=3e-2, min_lr=3e-2, warmup_steps=0)  # max_steps does not move the schedule
    raw = RawWeights()
    last = L.pytorch.callbacks.ModelCheckpoint(save_last=True, save_top_k=0)
    fit(corpus, tmp_path / "short", 5, raw, EMAWeights(decay=0.8), last, optim=constant)
    checkpoint = torch.load(tmp_path / "short" / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 5  # validations at 3 only: saved when the run ended
    for name, value in raw.steps[4].items():
        assert_close(checkpoint["current_model_state"][name], value, msg=name)
        if "ln_" not in name:
            assert not torch.equal(checkpoint["state_dict"][name], value), name  # the average

    straight = fit(corpus, tmp_path / "straight", 8, EMAWeights(decay=0.8), optim=constant)
    resumed = fit(
        corpus,
        tmp_path / "resumed",
        8,
        EMAWeights(decay=0.8),
        ckpt_path=str(tmp_path / "short" / "checkpoints" / "last.ckpt"),
        optim=constant,
    )
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        assert_close(a, b, rtol=0, atol=0, msg=name)


def test_a_run_without_the_average_resumes_the_raw_weights(corpus: Path, tmp_path: Path) -> None:
    """A checkpoint of a run with EMAWeights resumed by a run without it goes on from the raw
    weights (not from the average its `state_dict` holds): it ends where the averaged run's raw
    weights did."""
    raw = RawWeights()
    every_3 = L.pytorch.callbacks.ModelCheckpoint(every_n_train_steps=3, save_top_k=-1, filename="{step}")
    fit(corpus, tmp_path / "averaged", 6, raw, EMAWeights(decay=0.8), every_3)
    saved = tmp_path / "averaged" / "checkpoints" / "step=3.ckpt"
    plain = fit(corpus, tmp_path / "plain", 6, ckpt_path=str(saved))
    for name, value in plain.named_parameters():
        assert_close(value.detach(), raw.steps[-1][name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5])
def test_a_decay_outside_0_1_is_refused(decay: float) -> None:
    with pytest.raises(
        ConfigError, match=f"EMAWeights decay must be between 0 and 1 \\(exclusive\\), got {decay}"
    ):
        EMAWeights(decay=decay)


def test_train_py_with_ema_samples_from_the_average_and_refuses_a_bad_decay(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    ema = ["--trainer.callbacks+=minigpt.training.callbacks.averaging.EMAWeights", "--trainer.max_steps", "6"]
    run = tmp_path / "run"
    assert train_main(tiny_args(corpus, run, *ema, "--trainer.callbacks.decay", "0.9")) == 0
    capsys.readouterr()
    assert generate_main(["--checkpoint", str(run), "--prompt", "the", "--max_new_tokens", "8"]) == 0
    assert capsys.readouterr().out.startswith("the")

    bad = tiny_args(corpus, tmp_path / "bad", *ema, "--trainer.callbacks.decay", "1.5")
    assert train_main(bad) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: EMAWeights decay must be between 0 and 1 (exclusive), got 1.5"
    )


def test_the_moving_average_is_torch_s_ema_bit_for_bit_on_the_model_s_device() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3, bias=False)
    )
    model.register_buffer("table", torch.arange(4.0))
    ours = MovingAverage(model, 0.9)
    theirs = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=False)
    for step in range(5):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            model.table.add_(1.0)
        ours.update_parameters(model)
        theirs.update_parameters(model)
        for mine, reference in zip(ours.parameters(), theirs.parameters(), strict=True):
            assert torch.equal(mine, reference), step
    assert int(ours.n_averaged) == int(theirs.n_averaged) == 5
    assert torch.equal(ours.module.table, torch.arange(4.0) + 1.0)  # buffers: copied with the first update
    # A loaded state goes on counting from its own n_averaged.
    again = MovingAverage(model, 0.9)
    again.load_state_dict(ours.state_dict())
    again.update_parameters(model)
    theirs.update_parameters(model)
    for mine, reference in zip(again.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(mine, reference)
    with pytest.raises(ValueError, match="different devices"):
        MovingAverage(model, 0.9).to("meta").update_parameters(model)
