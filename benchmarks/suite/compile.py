"""The torch.compile section: speed-up over eager and cold compile time, for ours and the peer."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from dataclasses import replace

from .contestants import TrainSpec
from .entries import new_entries, run_interleaved
from .peer import load_peer
from .report import fmt
from .settings import State
from .stats import median, paired_ratio


def run(state: State) -> None:
    settings, rep = state.settings, state.report
    rep.add("## torch.compile")
    rep.add()
    cache = tempfile.mkdtemp(prefix="bench-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # cold compile: nothing cached from earlier runs
    specs = []
    for shape_name in settings.shapes:
        specs += [TrainSpec(shape_name, "ours", True), TrainSpec(shape_name, "ours", True, compile=True)]
        if load_peer() is not None:
            specs += [TrainSpec(shape_name, "peer", True), TrainSpec(shape_name, "peer", True, compile=True)]
    entries = new_entries(specs, settings)
    try:
        run_interleaved(entries, settings, state.matmul, "compile")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    rep.add(
        "bf16 autocast. Ours compiles `model.features`, as `--model.compile true` does (the LM "
        "head and the loss stay eager); the peer compiles the whole model (its loss stays eager). "
        "Compile time = first step minus the eager contestant's median step time (cold inductor "
        "cache); validation compiles once more (no-grad graph)."
    )
    rep.add()
    rows = []
    for e in entries:
        tps = list(e.tps.values())
        if e.error or not tps:
            rows.append([e.spec.shape, e.label, "failed", "", "", "", e.error or ""])
            continue
        eager = next(b for b in entries if b.spec == replace(e.spec, compile=False))
        compile_s = ""
        if e.spec.compile and eager.tps:
            compile_s = fmt(e.first_step_s - e.tokens / median(list(eager.tps.values())), 1)
        rows.append(
            [
                e.spec.shape,
                e.label,
                fmt(median(tps)),
                fmt(100 * median(list(e.mfu.values())), 1),
                f"{fmt(paired_ratio(e.tps, eager.tps), 2)}x",
                compile_s,
                "",
            ]
        )
    rep.table(["shape", "contestant", "tokens/s", "MFU %", "vs eager", "compile s", "note"], rows)
    for e in entries:
        e.release()
    gc.collect()
