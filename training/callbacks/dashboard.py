"""What a run shows besides numbers: text samples and attention maps as the model learns, and at
the end the loss curves and the HTML run report; in the run folder and on the wandb dashboard."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

from minigpt.common import appending, available_cores, reporting_write_failures, safe_write
from minigpt.model import GPT, generate
from minigpt.viz.attention import attention_of, draw_attention
from minigpt.viz.report import write_run_report

from ..config import SampleConfig
from .background import Job

ATTENTION_DIR = "attention"
"""In the run folder: the latest attention maps, one PNG per layer."""

SAMPLES_FILE = "samples.jsonl"
"""In the run folder: one {"step": ..., "text": ...} object per line, one line per sample."""


def whole_model(trainer: L.Trainer, pl_module: L.LightningModule) -> GPT | None:
    """The network with all its weights on rank 0, None on the other ranks. Every rank must call it.

    Under FSDP each rank holds a shard of every weight: the weights are gathered, through FSDP's
    full state dict, into a plain copy of the network (rank 0 only, one block at a time).
    """
    root = trainer.strategy.model
    if not isinstance(root, FullyShardedDataParallel):
        return pl_module.model if trainer.is_global_zero else None
    # Off the GPU as they arrive; on CPU processes there is nowhere to offload to, and PyTorch
    # 2.13's FSDP crashes (SIGSEGV) cloning the gathered weights if asked to.
    options = FullStateDictConfig(offload_to_cpu=pl_module.device.type != "cpu", rank0_only=True)
    with FullyShardedDataParallel.state_dict_type(root, StateDictType.FULL_STATE_DICT, options):
        state = root.state_dict()
    if not trainer.is_global_zero:
        return None
    model = GPT(pl_module.model.config)
    model.load_state_dict({key.removeprefix("model."): value for key, value in state.items()})
    return model.to(pl_module.device).eval()


def on_host(model: GPT) -> GPT:
    """`model`, or a copy of it in host memory where it lives on an accelerator: what a forked
    child, which cannot use the accelerator, computes with."""
    return model if model.lm_head.weight.device.type == "cpu" else copy.deepcopy(model).cpu()


class _Shown(L.Callback):
    """A callback whose work after each validation runs beside the training loop (`background.Job`):
    one validation's at a time, in one job or several working in parallel, collected as soon as it
    is done, and the last before training ends."""

    def __init__(self, background: bool) -> None:
        self.background = background
        self._jobs: tuple[list[Job], int] | None = None
        """The jobs under way and the step they show."""

    def start(self, trainer: L.Trainer, target: Any, *parts: tuple[Any, ...]) -> None:
        """`target(*part)` for each part, each in a job of its own; `show` gets their results."""
        self.collect(trainer)  # the previous validation's first: they show in order
        jobs = [Job(target, *part, background=self.background) for part in parts]
        self._jobs = (jobs, trainer.global_step)
        if not self.background:
            self.collect(trainer)

    def collect(self, trainer: L.Trainer) -> None:
        if self._jobs is not None:
            (jobs, step), self._jobs = self._jobs, None
            self.show(trainer, step, [job.result() for job in jobs])

    def show(self, trainer: L.Trainer, step: int, results: list[Any]) -> None:
        raise NotImplementedError

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self._jobs is not None and all(job.done() for job in self._jobs[0]):
            self.collect(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.collect(trainer)  # before the run report reads what it shows, when the fit ends

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.collect(trainer)


class SampleText(_Shown):
    """Generates a sample after every validation: printed, appended to `samples.jsonl` in the run
    folder, and logged to wandb as a table that grows by one row each time.

    Generates on rank 0 only, with its own seeded generator, so samples from different steps differ
    only by what the model learned. The tokens are drawn in a forked process on the host while
    training goes on (`background`), from the weights the validation scored; the sample is printed
    when it is done, and the run waits for the last one before it ends.
    """

    def __init__(self, sample: SampleConfig = SampleConfig(), background: bool = True) -> None:
        """
        Args:
            sample: The prompt, length and sampling settings.
            background: Generate beside the training loop (where the platform can fork); False:
                in it, on the training device, before training goes on.
        """
        super().__init__(background)
        self.sample = sample
        self.rows: list[list[Any]] = []
        """(step, text) of every sample so far."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not self.sample.max_new_tokens:
            return
        model = whole_model(trainer, pl_module)
        if model is None:  # not rank 0
            return
        tokenizer = trainer.datamodule.tokenizer  # encodes and decodes here: the child only computes
        prompt = (tokenizer.encode(self.sample.prompt) or [tokenizer.eot_id or 0])[
            -model.config.context_length :
        ]
        model = on_host(model) if self.background else model
        self.start(trainer, _new_tokens, (model, prompt, self.sample, tokenizer.eot_id))

    def show(self, trainer: L.Trainer, step: int, results: list[list[int]]) -> None:
        (new,) = results
        text = self.sample.prompt + trainer.datamodule.tokenizer.decode(new)
        trainer.lightning_module.print(f"\n--- sample at step {step} ---\n{text}\n---")
        self.rows.append([step, text])
        path = Path(trainer.default_root_dir) / SAMPLES_FILE
        with reporting_write_failures(path), appending(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, "text": text}) + "\n")
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_text(key="samples", columns=["step", "text"], data=self.rows, step=step)


def _new_tokens(model: GPT, prompt: list[int], cfg: SampleConfig, eot_id: int | None) -> list[int]:
    """The ids `model` generates after `prompt`, up to the end of the document if it ends one."""
    device = model.lm_head.weight.device
    out = generate(
        model,
        torch.tensor([prompt], device=device),
        cfg.max_new_tokens,
        **cfg.sampling(),
        stop_token=eot_id,
        generator=torch.Generator(device=device).manual_seed(cfg.seed),
    )
    new = out[0, len(prompt) :].tolist()
    return new[: new.index(eot_id)] if eot_id in new else new


class AttentionMaps(_Shown):
    """Draws the attention of every layer for a fixed prompt after each validation.

    The latest maps are kept as `<run>/attention/layer{i}.png` (the run report shows them) and
    logged to wandb as images, so the dashboard shows how the heads change as the model learns.
    Draws on rank 0 only. The weights are computed when validation ends (one forward pass of the
    prompt); they are drawn straight into pixels (`viz/heatmap.py`), by default in a forked process
    while training goes on, and the run waits for the last drawing before it ends, so the run
    report shows the final maps.
    """

    def __init__(
        self, prompt: str = "ROMEO:\nWhat light through yonder window breaks?", background: bool = True
    ) -> None:
        """
        Args:
            prompt: The text whose attention is drawn; keep it short (tens of tokens) to stay readable.
            background: Draw beside the training loop (where the platform can fork); False: in it.
        """
        super().__init__(background)
        self.prompt = prompt

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        model = whole_model(trainer, pl_module)
        if model is None:  # not rank 0
            return
        weights, labels = attention_of(model, trainer.datamodule.tokenizer, self.prompt)
        folder = Path(trainer.default_root_dir) / ATTENTION_DIR
        with reporting_write_failures(folder):
            folder.mkdir(parents=True, exist_ok=True)
        # The layers shared among as many jobs as there are cores: each draws on one core, and
        # after the last validation the run waits for the drawing.
        jobs = min(len(weights), available_cores())
        shares = [list(weights)[i::jobs] for i in range(jobs)]
        self.start(
            trainer, _draw_pngs, *(({n: weights[n] for n in s}, labels, self.prompt, folder) for s in shares)
        )

    def show(self, trainer: L.Trainer, step: int, results: list[list[Path]]) -> None:
        paths = sorted((p for part in results for p in part), key=lambda p: int(p.stem.removeprefix("layer")))
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                captions = [f"{p.stem} at step {step}" for p in paths]
                logger.log_image(key="attention", images=[str(p) for p in paths], caption=captions, step=step)


def _draw_pngs(weights: dict[int, Any], labels: list[str], prompt: str, folder: Path) -> list[Path]:
    """Draw the layers' grids into `folder` as `layer{i}.png`, each written atomically."""
    paths = []
    for name, png in draw_attention(weights, labels, prompt).items():
        paths.append(folder / f"{name}.png")
        with safe_write(paths[-1]) as tmp:
            tmp.write_bytes(png)
    return paths


class RunReport(L.Callback):
    """At the end of training: `<run>/loss_curves.png` and the self-contained `<run>/report.html`
    (curves, samples, attention maps, config, final figures), and the curves on wandb.

    The same files come from `python report.py --run <run folder>` at any time.
    """

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            logger.save()  # the CSV logger buffers rows; the report reads them from disk
        # A run shorter than its log interval has logged nothing: it still ends well, and says so.
        curves, _ = write_run_report(Path(trainer.default_root_dir), allow_empty=True)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_image(key="loss_curves", images=[str(curves)])
