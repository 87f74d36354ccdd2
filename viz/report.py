"""The run report: one self-contained HTML file in the run folder, readable offline and easy to
attach to a bug report. Curves, samples over time, attention maps, the final figures and the
resolved config; images are inlined, and nothing is fetched from anywhere.
"""

from __future__ import annotations

import base64
import json
import math
from datetime import datetime, timezone
from html import escape
from pathlib import Path

import numpy as np

from minigpt.common import duration, safe_write

from .curves import RunLog, read_run, write_curves

REPORT_FILE = "report.html"
"""In the run folder: the report `write_run_report` writes."""
SAMPLES_FILE = "samples.jsonl"
"""In the run folder: one {"step": ..., "text": ...} object per line, written during training."""
ATTENTION_DIR = "attention"
"""In the run folder: attention-map PNGs, included when no maps are passed in."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

_CSS = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 1240px; margin: 2em auto; padding: 0 1em;
       color: #222; }
h1 { margin-bottom: 0.1em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
.sub, .note { color: #666; }
table { border-collapse: collapse; } td, th { padding: 0.25em 1.2em 0.25em 0; text-align: left; }
td.num { font-variant-numeric: tabular-nums; font-weight: 600; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
pre { font: 13px/1.35 ui-monospace, monospace; background: #f6f8fa; padding: 0.7em; overflow-x: auto;
      white-space: pre-wrap; }
.sample h3 { font-size: 14px; margin: 1em 0 0.2em; }
figure { display: inline-block; margin: 0 1em 1em 0; vertical-align: top; }
"""


def read_samples(run_dir: Path) -> tuple[list[tuple[int, str]], str | None]:
    """(step, text) of every sample in `<run>/samples.jsonl`, oldest first, and a note on lines
    that could not be read."""
    path = run_dir / SAMPLES_FILE
    if not path.is_file():
        return [], None
    samples, bad = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
            samples.append((int(record["step"]), str(record["text"])))
        except (ValueError, KeyError, TypeError):
            bad += int(bool(line.strip()))
    samples.sort(key=lambda sample: sample[0])  # stable: samples of one step keep their order
    return samples, f"{bad} unreadable line(s) of {SAMPLES_FILE} skipped" if bad else None


def find_attention(run_dir: Path) -> dict[str, bytes]:
    """The attention-map PNGs in `<run>/attention/`, by file name."""
    folder = run_dir / ATTENTION_DIR
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.png"))} if folder.is_dir() else {}


def final_figures(log: RunLog) -> list[tuple[str, str]]:
    """(label, value) rows of what the log says about the end of the run; what it cannot tell is left
    out rather than guessed."""
    rows: list[tuple[str, str]] = []
    val, ppl, bpb = log.metrics.get("val_loss"), log.metrics.get("val_ppl"), log.metrics.get("val_bpb")

    def perplexity(i: int) -> str:
        at = np.flatnonzero(ppl.steps == val.steps[i]) if ppl is not None else np.array([], int)
        return f"{ppl.values[at[0]]:.2f}" if len(at) else f"{math.exp(min(val.values[i], 700)):.2f}"

    def bits_per_byte(i: int) -> list[tuple[str, str]]:
        at = np.flatnonzero(bpb.steps == val.steps[i]) if bpb is not None else np.array([], int)
        return (
            [(f"{'final' if i == -1 else 'best'} val bits per byte", f"{bpb.values[at[0]]:.4f}")]
            if len(at)
            else []
        )

    preference = "rewards/margins" in log.metrics  # a DPO run: its loss is no next-token loss
    if val is not None and len(val.values):
        best = int(np.nanargmin(val.values)) if np.isfinite(val.values).any() else len(val.values) - 1
        rows += [
            ("final val loss", f"{val.values[-1]:.4f} at step {val.steps[-1]:,}"),
            *([] if preference else [("final val perplexity", perplexity(-1))]),
            *bits_per_byte(-1),
            ("best val loss", f"{val.values[best]:.4f} at step {val.steps[best]:,}"),
            *([] if preference else [("best val perplexity", perplexity(best))]),
            *bits_per_byte(best),
        ]
    train = log.metrics.get("train_loss")
    if train is not None:
        rows.append(("last train loss", f"{train.values[-1]:.4f} at step {train.steps[-1]:,}"))
    for name, series in log.metrics.items():  # LitDPO's rewards, under TRL's names
        if name.startswith(("rewards/", "val_rewards/")) and len(series.values):
            rows.append((name, f"{series.values[-1]:.4f} at step {series.steps[-1]:,}"))
    for name, series in log.metrics.items():  # EvaluateTasks: lm-eval figures, and what they cost
        if name.startswith("eval/") and name != "eval/seconds" and len(series.values):
            rows.append((name.removeprefix("eval/"), f"{series.values[-1]:.4f} at step {series.steps[-1]:,}"))
    cost = log.metrics.get("eval/seconds")
    if cost is not None and len(cost.values):
        rows.append(
            ("task evaluation time", f"{duration(float(np.sum(cost.values)))} in {len(cost.values)} runs")
        )
    if not log.metrics:
        # log_every_n_steps and val_check_interval both lie beyond the run's last step.
        return [("metrics logged", "none yet: the run ended before its first log row or validation")]
    rows.append(("steps", f"{max(int(s.steps[-1]) for s in log.metrics.values()):,}"))
    if log.tokens is not None and len(log.tokens.values):
        rows.append(("tokens seen", f"{int(log.tokens.values[-1]):,}"))
    rate = log.metrics.get("tokens_per_sec")
    if rate is not None and len(rate.values):
        rows.append(("tokens per second (median)", f"{float(np.median(rate.values)):,.0f}"))
    wall = _wall_seconds(log)
    if wall is not None:
        rows.append(("wall time (from the log files' times)", duration(wall)))
    if log.resumed_at:
        steps = ", ".join(f"{s:,}" for s in log.resumed_at)
        # The CSV knows only the first step logged after each resume, not the checkpoint's step.
        rows.append(("resumed", f"before step{'s' if len(log.resumed_at) > 1 else ''} {steps}"))
    return rows


def _wall_seconds(log: RunLog) -> float | None:
    """Training time summed over versions: each version's config or hparams file is written at its
    start and its metrics.csv last at its end. Copied folders lose these times: then None."""
    total = 0.0
    for version in log.versions:
        starts = [
            p.stat().st_mtime for p in (version / "config.yaml", version / "hparams.yaml") if p.is_file()
        ]
        if not starts:
            return None
        total += (version / "metrics.csv").stat().st_mtime - min(starts)
    return total if total >= 1.0 else None


def _pre(text: str) -> str:
    # HTML drops one newline right after <pre>: this one, so that text starting with a newline (a
    # sample of a prompt ending in one) shows it.
    return f"<pre>\n{escape(text)}</pre>"


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{escape(alt)}">'


def render_report(
    log: RunLog,
    curves_png: bytes,
    samples: list[tuple[int, str]],
    attention_pngs: dict[str, bytes],
    notes: list[str] | None = None,
) -> str:
    """The report as one HTML document. Everything taken from the run is escaped."""
    name = log.run_dir.resolve().name
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    notes = [*log.notes, *(notes or [])]
    parts = [
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">',
        f"<title>{escape(name)}: run report</title>\n<style>{_CSS}</style>\n</head>\n<body>",
        f"<h1>{escape(name)}</h1>",
        f'<p class="sub">Run folder {escape(str(log.run_dir.resolve()))}; report written {made}.</p>',
        "<h2>Final figures</h2>\n<table>",
        *(f'<tr><th>{escape(k)}</th><td class="num">{escape(v)}</td></tr>' for k, v in final_figures(log)),
        "</table>",
        *(f'<p class="note">Note: {escape(n)}.</p>' for n in notes),
        "<h2>Loss curves</h2>",
        _img(curves_png, "train and val loss and learning rate against steps"),
        "<h2>Samples over time</h2>",
    ]
    if samples:
        parts += [f'<div class="sample"><h3>step {s:,}</h3>{_pre(t)}</div>' for s, t in samples]
    else:
        parts.append(f'<p class="note">No samples recorded (no {SAMPLES_FILE} in the run folder).</p>')
    parts.append("<h2>Attention maps</h2>")
    pngs = {k: v for k, v in attention_pngs.items() if v.startswith(PNG_SIGNATURE)}
    if pngs:
        parts += [
            f"<figure>{_img(v, k)}<figcaption>{escape(k)}</figcaption></figure>" for k, v in pngs.items()
        ]
    else:
        parts.append('<p class="note">No attention maps for this run.</p>')
    parts.append("<h2>Configuration</h2>")
    if log.config_text is not None:
        source = log.versions[-1] / "config.yaml"
        parts.append(f"<details><summary>{escape(str(source))}</summary>{_pre(log.config_text)}</details>")
    else:
        parts.append('<p class="note">No config.yaml in the CSV log.</p>')
    parts.append("</body>\n</html>\n")
    return "\n".join(parts)


def write_run_report(
    run_dir: Path, attention_pngs: dict[str, bytes] | None = None, allow_empty: bool = False
) -> tuple[Path, Path]:
    """Write `<run>/loss_curves.png` and `<run>/report.html` from the run folder alone; their paths.

    Args:
        run_dir: The run folder (`trainer.default_root_dir`).
        attention_pngs: Attention-map PNGs by caption; None: those in `<run>/attention/`, if any.

    Raises UsageError when the folder holds no CSV log or the log is empty, unless `allow_empty`
    (the end of a run shorter than its log interval: the report then says nothing was logged), and
    WriteError when the disk is full or the folder not the user's (the files there are as they were).
    Called at the end of training, the CSV logger must have been saved first, or the last rows are
    not on disk yet.
    """
    run_dir = Path(run_dir)
    log = read_run(run_dir, allow_empty=allow_empty)
    curves = write_curves(run_dir, log=log)
    samples, note = read_samples(run_dir)
    attention = find_attention(run_dir) if attention_pngs is None else attention_pngs
    html = render_report(log, curves.read_bytes(), samples, attention, [note] if note else None)
    report = run_dir / REPORT_FILE
    with safe_write(report) as tmp:
        tmp.write_text(html, encoding="utf-8")
    return curves, report
