"""Where a step's time goes on a GPU: torch.profiler over a few steps of `train.py` (the
`ProfileSteps` callback) or of a bare step (`profile_calls`), read into one short report.

The report answers what a loop adds to a step: the wall time per step against the time the GPU
was busy (kernels and copies, overlaps merged), the gaps in which it waited for the host, what the
host was doing in the longest of them, the waits for the device (synchronisations and copies back
to the host) per step, and the kernels and host ops that cost the most. Two windows are taken:
the first without Python stacks, for the figures; a short second one with them, so that each long
gap names the Python function the host was in (the stacks slow the host, so its figures are not
used).
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.profiler import ProfilerActivity, profile

DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
"""Trace categories of work on the device."""
GAP_US = 20.0
"""Idle stretches of the device shorter than this are launch latency, not waiting."""


def _activities() -> list[ProfilerActivity]:
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return activities


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _gaps(events: list[dict[str, Any]]) -> tuple[list[tuple[float, float]], list[tuple[float, float, float]]]:
    """The device's busy intervals in a trace, and its idle gaps of at least `GAP_US` as
    (length, start, end), longest first."""
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_WORK]
    busy = _merged((e["ts"], e["ts"] + e["dur"]) for e in device)
    gaps = [(b[0] - a[1], a[1], b[0]) for a, b in zip(busy, busy[1:], strict=False) if b[0] - a[1] >= GAP_US]
    return busy, sorted(gaps, reverse=True)


def read_trace(events: list[dict[str, Any]], steps: int, stacks: list[dict[str, Any]] | None = None) -> dict:
    """Figures per step from a chrome trace's `traceEvents` covering `steps` steps: device busy,
    its gaps (the longest with the host's innermost op, and with `stacks`' events from a
    second window, its Python function), synchronisations and copies."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    device = [e for e in spans if e.get("cat") in DEVICE_WORK]
    host = [e for e in spans if e.get("cat") in ("cpu_op", "user_annotation", "python_function")]
    runtime = [e for e in spans if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    if spans:
        begin = min(e["ts"] for e in spans)
        end = max(e["ts"] + e["dur"] for e in spans)
    else:
        begin = end = 0.0
    busy, gaps = _gaps(events)

    def inside(at: float, pool: list[dict[str, Any]], depth: int = 3) -> str:
        """The innermost `depth` host events running at `at` (on the thread with the most), outer to inner."""
        around = [e for e in pool if e["ts"] <= at <= e["ts"] + e["dur"]]
        if not around:
            return ""
        thread = Counter(e.get("tid") for e in around).most_common(1)[0][0]
        chain = sorted((e for e in around if e.get("tid") == thread), key=lambda e: e["ts"])
        return " > ".join(e["name"][-70:] for e in chain[-depth:])

    syncs = Counter(e["name"] for e in runtime if "Synchronize" in e["name"])
    copies = Counter(e["name"].split(" (")[0] for e in device if e.get("cat") == "gpu_memcpy")
    kernels: dict[str, float] = defaultdict(float)
    for e in device:
        kernels[e["name"][:80]] += e["dur"]
    per = max(1, steps)
    python = [e for e in stacks or [] if e.get("ph") == "X" and e.get("cat") == "python_function"]
    return {
        "steps": steps,
        "wall_ms": (end - begin) / 1e3 / per,
        "busy_ms": sum(b - a for a, b in busy) / 1e3 / per,
        "gaps_ms": sum(g[0] for g in gaps) / 1e3 / per,
        "gaps_per_step": len(gaps) / per,
        "longest_gaps": [
            {"ms": round(g[0] / 1e3, 3), "host": inside((g[1] + g[2]) / 2, host)} for g in gaps[:8]
        ],
        "syncs_per_step": {name: n / per for name, n in syncs.items()},
        "sync_ms_per_step": sum(e["dur"] for e in runtime if "Synchronize" in e["name"]) / 1e3 / per,
        "copies_per_step": {name: n / per for name, n in copies.items()},
        "kernels_per_step": len([e for e in device if e.get("cat") == "kernel"]) / per,
        "top_kernels_ms": {
            k: round(v / 1e3 / per, 3) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:15]
        },
        "python_in_gaps": [
            {"ms": round(g[0] / 1e3, 3), "python": inside((g[1] + g[2]) / 2, python, 5)}
            for g in _gaps(stacks or [])[1][:8]
        ],
    }


def _trace_events(prof: profile, keep: Path | None) -> list[dict[str, Any]]:
    raw = (
        keep.with_suffix(".json")
        if keep
        else Path(os.environ.get("TMPDIR", "/tmp")) / f"trace-{os.getpid()}.json"
    )
    prof.export_chrome_trace(str(raw))
    text = raw.read_text(encoding="utf-8")
    if keep:  # kept compressed: a few MB rather than tens
        with gzip.open(keep.with_suffix(".json.gz"), "wt", encoding="utf-8") as f:
            f.write(text)
    raw.unlink()
    return json.loads(text).get("traceEvents", [])


def _host_table(prof: profile) -> str:
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    averages = prof.key_averages()
    try:
        device_table = averages.table(sort_by=sort, row_limit=15, max_name_column_width=60)
    except (AttributeError, KeyError, ValueError):
        device_table = averages.table(
            sort_by="self_device_time_total", row_limit=15, max_name_column_width=60
        )
    host_table = averages.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60)
    return f"host ops by own time:\n{host_table}\ndevice time:\n{device_table}"


def write_report(path: Path, label: str, figures: dict, wall_s: float, tables: str) -> None:
    """`path`.json with the figures, `path`.md with them and the profiler's tables."""
    figures = {"label": label, "timed_ms_per_step": round(wall_s * 1e3 / figures["steps"], 3), **figures}
    path.with_suffix(".json").write_text(json.dumps(figures, indent=1), encoding="utf-8")
    lines = [f"# {label}", "", "```", json.dumps(figures, indent=1), "```", "", "```", tables, "```"]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")


class Window:
    """Profiles what runs between `begin` and `end`: figures first, then (`stacks`) names."""

    def __init__(self, path: Path, label: str, steps: int) -> None:
        self.path, self.label, self.steps = path, label, steps
        self.prof: profile | None = None
        self.stacked = False
        self.events: list[dict[str, Any]] = []
        self.tables = ""
        self.wall_s = 0.0
        self._t = 0.0

    def begin(self, stacks: bool = False) -> None:
        _sync()
        self.stacked = stacks
        self.prof = profile(activities=_activities(), with_stack=stacks)
        self.prof.__enter__()
        self._t = time.perf_counter()

    def end(self) -> None:
        _sync()
        wall = time.perf_counter() - self._t
        self.prof.__exit__(None, None, None)
        if not self.stacked:
            self.wall_s = wall
            self.events = _trace_events(self.prof, self.path)
            self.tables = _host_table(self.prof)
        else:
            stacks = _trace_events(self.prof, None)
            figures = read_trace(self.events, self.steps, stacks)
            write_report(self.path, self.label, figures, self.wall_s, self.tables)
        self.prof = None


def profile_calls(
    run: Callable[[], object], path: Path, label: str, steps: int = 20, stack_steps: int = 3
) -> None:
    """Profile `steps` calls of `run` (a bare step), then `stack_steps` more with Python stacks."""
    window = Window(path, label, steps)
    window.begin()
    for _ in range(steps):
        run()
    window.end()
    window.begin(stacks=True)
    for _ in range(stack_steps):
        run()
    window.end()


class ProfileSteps(L.Callback):
    """Profiles `train.py`'s optimizer steps `start` to `start + steps` (after the warm-up and
    compilation), then `stack_steps` more with Python stacks, and writes `path`.md/.json (and the
    first window's trace as `path`.json.gz). Add it with `--trainer.callbacks+=
    suite.profiling.ProfileSteps --trainer.callbacks.path=...` and this folder on PYTHONPATH."""

    def __init__(
        self, path: str, label: str = "train.py", start: int = 30, steps: int = 20, stack_steps: int = 3
    ) -> None:
        self.window = Window(Path(path), label, steps)
        self.marks = (start, start + steps, start + steps + stack_steps)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.marks[0] and self.window.prof is None and not self.window.events:
            self.window.begin()
        elif trainer.global_step == self.marks[1] and self.window.prof is None and self.window.events:
            self.window.begin(stacks=True)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.window.prof is None:
            return
        if trainer.global_step == self.marks[1] and not self.window.stacked:
            self.window.end()
        elif trainer.global_step == self.marks[2] and self.window.stacked:
            self.window.end()
