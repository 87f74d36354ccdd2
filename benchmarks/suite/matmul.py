"""Section 1, matmul throughput: every probe the run took, written first but measured throughout."""

from __future__ import annotations

import logging

from .probes import DTYPES, PROBE_SHAPE
from .report import fmt, fmt_range
from .settings import State
from .stats import median

log = logging.getLogger(__name__)


def run_rounds(state: State) -> None:
    """Standalone probe rounds when the training section does not run (it interleaves its own)."""
    repeats = state.settings.repeats
    log.info("[matmul] measuring")
    for r in range(repeats):
        log.info(f"[matmul] repeat {r + 1}/{repeats}")
        state.matmul.round()
        for dtype in DTYPES:
            state.matmul.probe(dtype)


def report(state: State) -> None:
    rep = state.report
    rep.add("## 1. Matmul throughput")
    rep.add()
    rep.add(
        "GFLOP/s of `a @ b` (new output tensor each call), every measurement taken during this run: "
        "one round per training repeat plus the best-of-3 probe taken right before every timed "
        f"training block. The probe shape ({PROBE_SHAPE}) is the peak that MFU is measured against, "
        "in the block's own precision and thread count."
    )
    rep.add()
    rows = []
    for (shape, dtype, threads), values in sorted(state.matmul.samples.items()):
        rows.append([shape, dtype, str(threads), fmt(median(values)), fmt_range(values), str(len(values))])
    rep.table(["shape", "dtype", "threads", "median GFLOP/s", "range", "samples"], rows)
