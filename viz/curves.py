"""Loss curves of a run, from its CSV log alone: train and val loss and the learning rate against
steps and tokens seen.

A run folder holds one `csv/version_N/metrics.csv` per start of the run (a resume adds a version).
`read_run` joins them into one series per metric; `plot_curves` draws the figure.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from minigpt.common import UsageError, data_settings, safe_write

if TYPE_CHECKING:  # matplotlib (~0.3 s) is imported where the curves are drawn, not when training starts
    from matplotlib.figure import Figure

Transform = Callable[[np.ndarray], np.ndarray]

CURVES_FILE = "loss_curves.png"
"""In the run folder: the figure `write_curves` draws."""


@dataclass(frozen=True)
class Series:
    """One metric over a run."""

    steps: np.ndarray
    """Optimizer steps completed when each value was logged, increasing (int64)."""
    values: np.ndarray
    """The metric's values (float64), one per step."""


@dataclass(frozen=True)
class RunLog:
    """What a run's CSV log says, joined over all its versions."""

    run_dir: Path
    versions: tuple[Path, ...]
    """The `version_N` folders read, in order."""
    metrics: dict[str, Series]
    """Every logged metric by its CSV column name (`train_loss`, `val_loss`, `lr-AdamW/decay`, ...)."""
    tokens: Series | None
    """Tokens seen against steps: the `tokens_seen` column, else steps x tokens per step from the
    config; None when neither is known."""
    config_text: str | None
    """The resolved config (the last version's `config.yaml`), as written."""
    notes: tuple[str, ...] = ()
    """What had to be assumed, one short line each."""
    resumed_at: tuple[int, ...] = ()
    """The first step each later version logged: where the run was resumed."""


def version_dirs(run_dir: Path) -> list[Path]:
    """The run's CSV log folders in the order they were written; a folder holding a metrics.csv
    itself counts as the only one."""
    if (run_dir / "metrics.csv").is_file():
        return [run_dir]
    numbered = []
    for folder in run_dir.glob("csv/version_*"):
        match = re.fullmatch(r"version_(\d+)", folder.name)
        if match and (folder / "metrics.csv").is_file():
            numbered.append((int(match.group(1)), folder))
    return [folder for _, folder in sorted(numbered)]  # by number: version_10 after version_9


def read_run(run_dir: Path, allow_empty: bool = False) -> RunLog:
    """Read and join a run's CSV logs. Raises UsageError when there is no log or it is empty, unless
    `allow_empty`: a run that ended before its first log row still gets a (mostly empty) log."""
    if not run_dir.is_dir():
        raise UsageError(f"no run folder at {run_dir}")
    versions = version_dirs(run_dir)
    if not versions and not allow_empty:
        raise UsageError(f"no CSV log in {run_dir} (looked for csv/version_*/metrics.csv)")
    joined: dict[str, dict[int, float]] = {}
    resumed_at: list[int] = []
    for version in versions:
        rows = _read_metrics(version / "metrics.csv")
        if not rows:
            continue
        # A resumed run restarts from its checkpoint, so whatever an earlier version logged from the
        # resumed version's first step on was undone: the later version wins from there.
        first = min(min(by_step) for by_step in rows.values())
        if joined:
            resumed_at.append(first)
        for name, by_step in joined.items():
            joined[name] = {s: v for s, v in by_step.items() if s < first}
        for name, by_step in rows.items():
            joined.setdefault(name, {}).update(by_step)
    metrics = {name: _series(by_step) for name, by_step in joined.items() if by_step}
    if not metrics and not allow_empty:
        raise UsageError(f"the CSV log in {run_dir} is empty: no metric has been logged yet")
    config_path = versions[-1] / "config.yaml" if versions else None
    config_text = config_path.read_text(encoding="utf-8") if config_path and config_path.is_file() else None
    tokens, notes = _tokens_seen(metrics, config_text)
    return RunLog(run_dir, tuple(versions), metrics, tokens, config_text, notes, tuple(resumed_at))


def _read_metrics(path: Path) -> dict[str, dict[int, float]]:
    """metrics.csv as {column: {step: value}}; Lightning's rows are sparse (empty cells: not logged)."""
    out: dict[str, dict[int, float]] = {}
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if not row.get("step"):
                    continue
                # Lightning counts steps from 0; +1 gives the steps completed, so a validation
                # every 50 steps lands on 50, 100, ... as in the samples and checkpoints.
                step = int(float(row["step"])) + 1
                for name, cell in row.items():
                    if name not in ("step", "epoch") and name is not None and cell not in (None, ""):
                        out.setdefault(name, {})[step] = float(cell)
    except (ValueError, csv.Error, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read {path}: {err}") from None
    return out


def _series(by_step: dict[int, float]) -> Series:
    steps = sorted(by_step)
    return Series(np.array(steps, dtype=np.int64), np.array([by_step[s] for s in steps], dtype=np.float64))


def _tokens_seen(
    metrics: dict[str, Series], config_text: str | None
) -> tuple[Series | None, tuple[str, ...]]:
    if "tokens_seen" in metrics:
        return metrics["tokens_seen"], ()
    if not metrics:
        return None, ()
    if config_text is None:
        return None, ("tokens seen unknown: no tokens_seen column and no config.yaml",)
    try:
        config = yaml.safe_load(config_text) or {}
        per_rank = (
            data_settings(config)["config"]["batch_size"]
            * config["model"]["gpt"]["context_length"]
            * (config.get("trainer", {}).get("accumulate_grad_batches") or 1)
        )
    except (yaml.YAMLError, KeyError, TypeError):
        return None, ("tokens seen unknown: config.yaml lacks the batch size or context length",)
    trainer = config.get("trainer", {})
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    notes: tuple[str, ...] = ()
    if not isinstance(devices, int) or not isinstance(nodes, int) or devices < 1 or nodes < 1:
        # "auto", -1 or a list of device ids: the process count is not in the config.
        devices, nodes = 1, 1
        notes = (f"tokens seen assume 1 process (trainer.devices is {trainer.get('devices')!r})",)
    steps = np.unique(np.concatenate([s.steps for s in metrics.values()]))
    return Series(steps, steps.astype(np.float64) * per_rank * devices * nodes), notes


def smooth(values: np.ndarray, span: float) -> np.ndarray:
    """Exponential moving average over `span` points, bias-corrected so it starts at the data
    rather than at zero."""
    beta = 1.0 - 1.0 / max(span, 1.0)
    out, avg = np.empty_like(values), 0.0
    for i, value in enumerate(values):
        avg = beta * avg + (1.0 - beta) * value
        out[i] = avg / (1.0 - beta ** (i + 1)) if beta > 0 else value
    return out


def _steps_to_tokens(tokens: Series) -> tuple[Transform, Transform]:
    """Maps between steps and tokens seen for a secondary axis, linear beyond both ends of the log:
    the axis margins must map too, or the two scales drift apart."""
    steps, seen = [0.0], [0.0]
    for step, count in zip(tokens.steps.tolist(), tokens.values.tolist(), strict=True):
        if step > steps[-1] and count > seen[-1]:  # interpolation needs both to increase
            steps.append(step)
            seen.append(count)
    xs, ys = np.array(steps), np.array(seen)
    slope = ys[-1] / xs[-1] if xs[-1] > 0 else 1.0

    def forward(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        beyond = np.where(x < 0, x * slope, ys[-1] + (x - xs[-1]) * slope)
        return np.where((x < 0) | (x > xs[-1]), beyond, np.interp(x, xs, ys))

    def inverse(y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        beyond = np.where(y < 0, y / slope, xs[-1] + (y - ys[-1]) / slope)
        return np.where((y < 0) | (y > ys[-1]), beyond, np.interp(y, ys, xs))

    return forward, inverse


def plot_curves(log: RunLog) -> Figure:
    """Train loss (raw, faint, and smoothed) and val loss above, learning rate below, against
    steps, with tokens seen along the top."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    fig = Figure(figsize=(12, 7), dpi=100, layout="constrained")
    loss_ax, lr_ax = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    train, val = log.metrics.get("train_loss"), log.metrics.get("val_loss")
    if train is not None:
        loss_ax.plot(train.steps, train.values, color="tab:blue", alpha=0.25, lw=1, label="train (raw)")
        finite = np.isfinite(train.values)
        span = max(1.0, finite.sum() / 20)  # about a twentieth of the run, whatever the log interval
        loss_ax.plot(
            train.steps[finite], smooth(train.values[finite], span), color="tab:blue", lw=2, label="train"
        )
    if val is not None:
        loss_ax.plot(val.steps, val.values, "o-", color="tab:orange", ms=6, lw=1.5, label="val")
        loss_ax.set_title(f"{log.run_dir.name}: final val loss {val.values[-1]:.4f} at step {val.steps[-1]}")
    else:
        loss_ax.set_title(log.run_dir.name)
    if not log.metrics:
        loss_ax.text(0.5, 0.5, "nothing logged yet", transform=loss_ax.transAxes, ha="center", color="grey")
    loss_ax.set_ylabel("loss (nats per token)")
    loss_ax.grid(alpha=0.3)
    if train is not None or val is not None:
        loss_ax.legend(loc="upper right")
    if log.tokens is not None and len(log.tokens.steps):
        top = loss_ax.secondary_xaxis("top", functions=_steps_to_tokens(log.tokens))
        # With a token count, the only possible note is that the process count was assumed.
        top.set_xlabel("tokens seen" + (" (assuming 1 process)" if log.notes else ""))
        top.xaxis.set_major_formatter(EngFormatter(sep=""))
    for i, step in enumerate(log.resumed_at):  # a jump in the curves there is the resume's doing
        for ax in (loss_ax, lr_ax):
            ax.axvline(
                step, color="grey", ls=":", lw=1.2, label="resumed" if i == 0 and ax is lr_ax else None
            )
    lr_names = _distinct_lr(log.metrics)
    for name in lr_names:
        lr = log.metrics[name]
        lr_ax.plot(lr.steps, lr.values, lw=1.5, label=name.removeprefix("lr-"))
    if not lr_names:
        lr_ax.text(0.5, 0.5, "no learning rate logged", transform=lr_ax.transAxes, ha="center", color="grey")
    if len(lr_names) > 1 or log.resumed_at:
        lr_ax.legend(loc="upper right", fontsize="small")
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("step")
    peaks = [float(np.max(log.metrics[name].values)) for name in lr_names]
    if len(peaks) > 1 and min(peaks) > 0 and max(peaks) > LOG_LR_SPREAD * min(peaks):
        # Muon's rate and AdamW's differ ~20x: on a linear axis the smaller is a flat line at 0.
        lr_ax.set_yscale("log")
    else:
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    lr_ax.grid(alpha=0.3)
    return fig


LOG_LR_SPREAD = 4.0
"""Learning rates whose peaks differ more than this many times are drawn on a log axis."""


def _distinct_lr(metrics: dict[str, Series]) -> list[str]:
    """Learning-rate columns, one per schedule: parameter groups that share one are drawn once."""
    kept: list[str] = []
    for name in sorted(n for n in metrics if n.startswith("lr-")):
        s = metrics[name]
        if not any(
            np.array_equal(s.steps, metrics[k].steps) and np.allclose(s.values, metrics[k].values)
            for k in kept
        ):
            kept.append(name)
    return kept


def write_curves(run_dir: Path, out: Path | None = None, log: RunLog | None = None) -> Path:
    """Draw the run's curves into `out` (default: `<run>/loss_curves.png`), atomically."""
    log = log if log is not None else read_run(run_dir)
    out = out if out is not None else run_dir / CURVES_FILE
    fig = plot_curves(log)
    with safe_write(out) as tmp:
        fig.savefig(tmp, format="png")
    return out
