"""What a run reports about itself: FLOPs, throughput, tokens seen, MFU, the console, the samples."""

from __future__ import annotations

import csv
import json
import logging
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from minigpt.data import DataConfig, TextDataModule
from minigpt.model import GPT, GPTConfig
from minigpt.training.callbacks import throughput
from minigpt.training.callbacks.console import RunSummary, StepProgressBar, compile_tip
from minigpt.training.callbacks.dashboard import SampleText
from minigpt.training.callbacks.throughput import TokensPerSecond
from minigpt.training.config import SampleConfig
from minigpt.training.flops import training_flops_per_token
from minigpt.training.lightning_internals import logging_step
from minigpt.training.lit import LitGPT

SHAPE = GPTConfig(context_length=16, n_layer=2, n_head=2, n_embd=32)


def test_flops_per_token_counts_every_matmul_weight_and_the_attention_products() -> None:
    config = replace(SHAPE, vocab_size=50)
    model = GPT(config)
    # Independent count: every Linear weight (the tied head counts: it is a matmul of its own).
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert linear == 12 * 2 * 32**2 + 50 * 32
    attention = 2 * 2 * 16 * 32 * 2 * 3  # QKᵀ and AV, 2 FLOPs per MAC, per layer, forward + backward
    assert training_flops_per_token(config) == 6 * linear + attention


def fit(
    tmp_path: Path, corpus: Path, callbacks: list[L.Callback], steps: int = 6, log_every: int = 1
) -> L.Trainer:
    data = TextDataModule(
        DataConfig(source=str(corpus), tokenizer="char", cache_dir=str(tmp_path / "cache"), batch_size=4),
        context_length=SHAPE.context_length,
    )
    trainer = L.Trainer(
        max_steps=steps,
        val_check_interval=3,
        limit_val_batches=2,
        accelerator="cpu",
        logger=CSVLogger(tmp_path, name="csv"),
        callbacks=[*callbacks, ModelCheckpoint(dirpath=tmp_path / "checkpoints", monitor="val_loss")],
        log_every_n_steps=log_every,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(LitGPT(SHAPE), datamodule=data)
    return trainer


def metrics(tmp_path: Path) -> list[dict[str, str]]:
    with open(tmp_path / "csv" / "version_0" / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_tokens_seen_throughput_and_mfu_are_logged_per_step(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The callback's clock at the end of steps 1 to 3, the start of step 4 (after the validation)
    # and the end of steps 4 to 6, so the figures are exact.
    ends = iter([0.0, 0.25, 0.75, 10.0, 11.0, 12.0, 12.5])
    monkeypatch.setattr(throughput, "time", SimpleNamespace(perf_counter=lambda: next(ends)))
    trainer = fit(tmp_path, corpus, [TokensPerSecond(peak_flops=1e12)])
    rows = [r for r in metrics(tmp_path) if r.get("tokens_seen")]
    # 4 windows of 16 tokens per step, one process, no accumulation.
    assert [float(r["tokens_seen"]) for r in rows] == [64.0 * step for step in range(1, 7)]
    # 64 tokens over the time since the previous step's end; step 1 has none, and step 4, after the
    # validation, is timed from its own start (not from before the validation, nor left to repeat
    # step 3's figures, as Lightning does with a step metric a callback did not log again).
    rates = {2: 64 / 0.25, 3: 64 / 0.5, 4: 64 / 1.0, 5: 64 / 1.0, 6: 64 / 0.5}
    timed = {step: rows[step - 1] for step in rates}
    assert {step: float(row["tokens_per_sec"]) for step, row in timed.items()} == rates
    assert not rows[0]["tokens_per_sec"]
    # MFU from the shape alone: 6 FLOPs per weight of every matmul (2 forward, 4 backward) per token,
    # and attention's QKᵀ and AV, 2 x 2 x T x n_embd FLOPs per layer per token forward, 3x that with
    # backward; over the 1e12 FLOP/s peak given.
    model = trainer.lightning_module.model
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    flops_per_token = 6 * linear + 3 * 2 * 2 * SHAPE.context_length * SHAPE.n_embd * SHAPE.n_layer
    for step, row in timed.items():  # logged as float32: 1e-6 is 10x its rounding
        assert float(row["mfu"]) == pytest.approx(rates[step] * flops_per_token / 1e12, rel=1e-6), step


def test_steps_whose_logs_lightning_drops_log_nothing_and_throughput_spans_the_steps_between(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning writes every log_every_n_steps-th step's values and drops the rest, and each
    `log` call costs the same either way: the step figures are logged only where they are kept,
    and tokens per second covers every step since the last written one."""
    ends = iter([0.0, 0.25, 10.0, 11.0, 12.0])  # ends of steps 1, 2; start of 4 (after validation); 4, 6
    monkeypatch.setattr(throughput, "time", SimpleNamespace(perf_counter=lambda: next(ends)))
    calls: list[tuple[int, str]] = []
    log = LitGPT.log

    def counted(module: LitGPT, name: str, *args: object, **kwargs: object) -> None:
        if module.trainer.training:  # the step being taken, from 1
            calls.append((logging_step(module.trainer) + 1, name))
        log(module, name, *args, **kwargs)

    monkeypatch.setattr(LitGPT, "log", counted)
    fit(tmp_path, corpus, [TokensPerSecond()], log_every=2)
    rows = [r for r in metrics(tmp_path) if r.get("train_loss")]
    assert [int(r["step"]) for r in rows] == [1, 3, 5]  # steps 2, 4 and 6, counted from 0
    assert [float(r["tokens_seen"]) for r in rows] == [128.0, 256.0, 384.0]
    assert [float(r["tokens_per_sec"]) for r in rows] == [64 / 0.25, 64 / 1.0, 128 / 1.0]
    assert all(r["grad_norm"] for r in rows)
    # Step 1's tokens_seen starts the clock; otherwise nothing is logged on steps 1, 3 and 5.
    assert {step for step, name in calls if (step, name) != (1, "tokens_seen")} == {2, 4, 6}, calls
    assert {name for step, name in calls if step == 2} == {
        "train_loss",
        "grad_norm",
        "tokens_seen",
        "tokens_per_sec",
    }


def test_mfu_is_omitted_where_no_peak_is_known(corpus: Path, tmp_path: Path) -> None:
    fit(tmp_path, corpus, [TokensPerSecond()])
    assert "mfu" not in metrics(tmp_path)[0]


def test_the_progress_bar_counts_the_runs_steps(corpus: Path, tmp_path: Path) -> None:
    bar = StepProgressBar()
    fit(tmp_path, corpus, [bar], steps=7)
    assert bar.train_progress_bar.total == 7 and bar.train_progress_bar.n == 7


def test_the_run_summary_says_what_will_happen_and_what_did(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="minigpt"):
        trainer = fit(tmp_path, corpus, [RunSummary()])
    text = caplog.text
    assert "model: 2 layers x 2 heads x 32 wide, context 16" in text
    every = sum(p.numel() for p in trainer.lightning_module.model.parameters())
    assert f"training: all {every:,} parameters" in text  # test_lora.py: a LoRA run's count
    assert (
        "6 in all, global batch 64 tokens (micro-batch 4 windows x 16 tokens x 1 accumulated x 1 process) "
        "= 384 tokens" in text
    )
    best = float(trainer.checkpoint_callback.best_model_score)
    # Characters of ASCII text, one byte each, and no end-of-text: bits per byte are nats / ln 2.
    bpb = best / math.log(2)
    assert (
        "done: 6 steps, 384 tokens in" in text
        and f"best val loss {best:.3f} ({bpb:.3f} bits per byte)" in text
    )


def test_the_run_summary_suggests_compiling_only_an_eager_gpu_run_of_rope_or_qk_norm() -> None:
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    modern = GPTConfig(vocab_size=65, position_embedding="rope", qk_norm=True)
    assert "--model.compile true" in compile_tip(cuda, modern, compiled=False)
    assert "--model.compile true" in compile_tip(cuda, replace(modern, qk_norm=False), compiled=False)
    assert "--model.compile true" in compile_tip(cuda, replace(modern, position_embedding="learned"), False)
    assert compile_tip(cuda, modern, compiled=True) is None
    assert compile_tip(cpu, modern, compiled=False) is None  # the gap it cites was measured on a GPU
    assert compile_tip(cuda, GPTConfig(vocab_size=65), compiled=False) is None  # GPT-2's recipe


def test_samples_go_to_the_run_folder(corpus: Path, tmp_path: Path) -> None:
    fit(tmp_path, corpus, [SampleText(SampleConfig(prompt="the", max_new_tokens=5))])
    lines = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [3, 6]
    assert all(line["text"].startswith("the") and len(line["text"]) == 3 + 5 for line in lines)
