"""Section 3, Lightning overhead: `LitGPT` + `Trainer` against the same steps in a bare loop."""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace
from typing import Any

import torch

from minigpt.model import GPT
from minigpt.training.optim import build_optimizer, build_scheduler

from .contestants import OPTIM
from .report import fmt, fmt_range
from .settings import State
from .shapes import shapes
from .stats import median, now, paired_ratio, rotated

log = logging.getLogger(__name__)


def run(state: State) -> None:
    import lightning as L  # imported here: the other sections never pay for it
    from torch.utils.data import DataLoader

    from minigpt.training.lit import LitGPT

    settings, rep = state.settings, state.report
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")

    shape = shapes()["small"]
    batch = shape.batch_size(settings.batch_div)
    steps = settings.steps
    warmup = max(1, settings.warmup)
    total = warmup + steps
    g = torch.Generator().manual_seed(99)
    batches = [
        (
            torch.randint(shape.vocab, (batch, shape.context), generator=g),
            torch.randint(shape.vocab, (batch, shape.context), generator=g),
        )
        for _ in range(total)
    ]
    loader = DataLoader(batches, batch_size=None, shuffle=False)
    optim = replace(OPTIM, warmup_steps=10)

    def new_lit() -> LitGPT:
        torch.manual_seed(0)
        lit = LitGPT(gpt=shape.gpt_config(), optim=optim)
        # LitGPT builds its GPT in configure_model from trainer.datamodule.tokenizer; with a plain
        # DataLoader there is no datamodule, so the model is set here and configure_model keeps it.
        lit.model = GPT(shape.gpt_config())
        return lit

    class StepTimes(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_end(self, *unused: Any) -> None:
            self.times.append(now())

    lit = new_lit()
    bare = new_lit()  # only its model and `loss` are used; LitGPT's hooks need a Trainer
    bare_params = list(bare.model.parameters())
    clip = optim.grad_clip
    bare_opt = build_optimizer(bare.model, optim)
    bare_sched = build_scheduler(bare_opt, optim, 10_000)

    lit_tps: dict[int, float] = {}
    bare_tps: dict[int, float] = {}
    lit_mfu: dict[int, float] = {}
    bare_mfu: dict[int, float] = {}
    fit_seconds: list[float] = []
    flops_per_step = shape.flops_per_token() * batch * shape.context

    def run_lightning(r: int) -> None:
        timer = StepTimes()
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            precision="bf16-mixed",
            max_steps=total,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            callbacks=[timer],
        )
        peak = state.matmul.probe("bf16")
        threads = torch.get_num_threads()
        start = now()
        trainer.fit(lit, train_dataloaders=loader)
        fit_seconds.append(now() - start)
        torch.set_num_threads(threads)
        seconds = timer.times[-1] - timer.times[warmup - 1]
        lit_tps[r] = batch * shape.context * steps / seconds
        lit_mfu[r] = flops_per_step * steps / seconds / (peak * 1e9)
        log.info(f"  [{r}] Lightning: {lit_tps[r]:,.0f} tok/s (fit() {fit_seconds[-1]:.1f} s)")

    def run_bare(r: int) -> None:
        peak = state.matmul.probe("bf16")
        times = []
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = bare.loss(x, y)
            if not torch.isfinite(loss):  # LitGPT checks the loss and the gradient norm too
                raise RuntimeError(f"loss is {loss.item()}")
            loss.backward()
            if clip is not None:
                norm = torch.nn.utils.clip_grad_norm_(bare_params, clip)
                if not torch.isfinite(norm):
                    raise RuntimeError(f"gradient norm is {norm.item()}")
            bare_opt.step()
            bare_sched.step()
            bare_opt.zero_grad(set_to_none=True)
            times.append(now())
        seconds = times[-1] - times[warmup - 1]
        bare_tps[r] = batch * shape.context * steps / seconds
        bare_mfu[r] = flops_per_step * steps / seconds / (peak * 1e9)
        log.info(f"  [{r}] bare loop: {bare_tps[r]:,.0f} tok/s")

    log.info("[lightning] LitGPT + Trainer vs a bare loop")
    error = ""
    try:
        for r in range(settings.repeats):
            log.info(f"[lightning] repeat {r + 1}/{settings.repeats}")
            for run_one in rotated([run_lightning, run_bare], r):
                run_one(r)
    except Exception as exc:  # report what broke, keep the rows measured so far
        error = f"{type(exc).__name__}: {exc}"
        log.info(f"  FAILED: {error}")

    rep.add("## 3. Lightning overhead")
    rep.add()
    rep.add(
        f"Small shape, batch {batch}, bf16 autocast (`precision='bf16-mixed'`), `build_optimizer` + "
        f"`build_scheduler`, gradient clipping to {clip} (OptimConfig.grad_clip, which LitGPT applies "
        "itself). Lightning: `Trainer(accelerator='cpu', logger=False, enable_checkpointing=False, "
        "enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)` with a plain "
        "DataLoader of in-memory batches; `lit.model` is set before `fit` because `configure_model` "
        "otherwise needs `trainer.datamodule.tokenizer`. Bare loop: the same work written out on the "
        "same batches and a copy of the same initial model — `LitGPT.loss` "
        f"(fused_loss={lit.fused_loss}), the finiteness checks "
        "LitGPT makes, `clip_grad_norm_`, AdamW step, scheduler step, zero_grad."
        f" Throughput counts the {steps} steps after {warmup} warm-up "
        "step(s) of each `fit()`; `fit()` wall time also includes its start-up."
    )
    rep.add()
    if error:
        rep.add(f"FAILED: {error}")
        rep.add()
    if lit_tps and bare_tps:
        overhead = paired_ratio(bare_tps, lit_tps) - 1
        rows = [
            [
                "bare PyTorch loop",
                fmt(median(list(bare_tps.values()))),
                fmt_range(list(bare_tps.values())),
                fmt(100 * median(list(bare_mfu.values())), 1),
                "",
                "",
            ],
            [
                "LitGPT + Trainer",
                fmt(median(list(lit_tps.values()))),
                fmt_range(list(lit_tps.values())),
                fmt(100 * median(list(lit_mfu.values())), 1),
                f"{fmt(100 * overhead, 1)} %",
                fmt(median(fit_seconds), 1),
            ],
        ]
        rep.table(["loop", "tokens/s", "range", "MFU %", "step overhead", f"fit() s ({total} steps)"], rows)
