"""The levers section: glibc allocator settings (one process each) crossed with thread counts."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, replace

import torch

from .contestants import TrainSpec
from .entries import TrainEntry
from .malloc import MALLOC_DESCRIPTIONS
from .peer import load_peer
from .report import fmt, fmt_range
from .settings import Settings, State
from .shapes import shapes
from .stats import median, paired_ratio, rotated
from .train import headroom_note
from .worker import Worker

log = logging.getLogger(__name__)

Results = dict[tuple[str, int], TrainEntry]
"""(allocator variant, index of the spec) -> its measurements."""


def alloc_specs(settings: Settings, best_chunk: int, many: int) -> list[TrainSpec]:
    """The contestants, grouped by thread count so each process switches threads at most twice a round."""
    peer = load_peer() is not None
    specs = []
    for t in sorted({1, many}):
        specs.append(TrainSpec("small", "ours", True, "fused", best_chunk, threads=t))
        if peer:
            specs.append(TrainSpec("small", "peer", True, threads=t))
    if not settings.quick:
        specs.append(TrainSpec("small", "ours", True, threads=many))
        if peer:
            specs.append(TrainSpec("small", "peer", False, adamw="default", threads=many))
            specs.append(TrainSpec("small", "peer-fast", True, threads=many))
        if "char" in settings.shapes:  # train.py's allocator setting at the char shape too
            specs.append(TrainSpec("char", "ours", True, threads=many))
            specs.append(TrainSpec("char", "ours", True, skip_elementwise=True, threads=many))
            if peer:
                specs.append(TrainSpec("char", "peer", True, threads=many))
                specs.append(TrainSpec("char", "peer-fast", True, threads=many))
    return specs


def run(state: State) -> None:
    settings = state.settings
    many = torch.get_num_threads()
    specs = alloc_specs(settings, state.best_chunk, many)
    shape_names = sorted({spec.shape for spec in specs}, key=list(shapes()).index)
    variants = settings.malloc
    log.info(f"[alloc] starting {len(variants)} worker processes: {', '.join(variants)}")
    workers = {v: Worker(v, settings.batch_div) for v in variants}
    results: Results = {}
    problems: dict[str, str] = {}
    peak_rss: dict[str, float] = {}
    try:
        for v, worker in workers.items():
            answer = worker.call(cmd="build", specs=[asdict(s) for s in specs], warmup=settings.warmup)
            problems[v] = answer["problem"]
            for i, spec in enumerate(specs):
                results[v, i] = TrainEntry(spec, error=answer["errors"][i])
        for r in range(settings.repeats):
            log.info(f"[alloc] repeat {r + 1}/{settings.repeats}")
            for name in shape_names:
                shape = shapes()[name]
                state.bound.measure("alloc", shape, shape.batch_size(settings.batch_div), r)
            for i in rotated(list(range(len(specs))), r):
                for v in rotated(list(variants), r):
                    entry = results[v, i]
                    if entry.error:
                        continue
                    answer = workers[v].call(cmd="run", index=i, repeat=r, steps=settings.steps)
                    entry.tps[r], entry.mfu[r], entry.faults[r] = (
                        answer["tps"],
                        answer["mfu"],
                        answer["faults"],
                    )
                    peak_rss[v] = max(peak_rss.get(v, 0.0), answer["rss"])
                    log.info(f"  [{r}] {v:8s} {specs[i].name}: {answer['tps']:,.0f} tok/s")
    finally:
        for worker in workers.values():
            worker.close()
    record_fastest(state, specs, results, shape_names, many)
    report(state, specs, results, problems, peak_rss, many)


def record_fastest(
    state: State, specs: list[TrainSpec], results: Results, shape_names: list[str], many: int
) -> None:
    """The fastest of ours and of the peer per shape and allocator setting, for the bound section."""
    for v in state.settings.malloc:
        for name in shape_names:
            for kind in ("ours", "peer"):
                timed = [
                    (spec, results[v, i])
                    for i, spec in enumerate(specs)
                    if spec.shape == name
                    and spec.impl.startswith(kind)
                    and spec.threads == many
                    and not spec.skip_elementwise
                    and results[v, i].tps
                ]
                if timed:
                    spec, best = max(timed, key=lambda pair: median(list(pair[1].tps.values())))
                    label = f"{spec.name}, allocator {v}"
                    state.fastest[f"{name} {kind} {v}"] = (label, "alloc", best.tps)


def report(
    state: State,
    specs: list[TrainSpec],
    results: Results,
    problems: dict[str, str],
    peak_rss: dict[str, float],
    many: int,
) -> None:
    rep, variants = state.report, state.settings.malloc
    rep.add("## Levers: allocator settings and threads")
    rep.add()
    rep.add(
        "Each allocator setting runs in its own fresh process (applied with ctypes `mallopt` before "
        "any tensor exists); the processes take turns, one timed block at a time, and every process "
        "runs every contestant, so each setting is applied equally to ours and the peer. "
        f"Threads: `torch.set_num_threads` before each block ({os.cpu_count() or 1} cores visible). "
        f"Small shape (and the char shape at {many} threads), same batches and optimizer settings as "
        "section 2. Speed-up is against the same contestant "
        f"with the first setting ({variants[0]}) at the same thread count; MFU is against the matmul "
        "probe at the block's thread count."
    )
    rep.add()
    for v in variants:
        not_applied = f" — NOT APPLIED: {problems[v]}" if problems[v] else ""
        rep.add(f"- **{v}**: {MALLOC_DESCRIPTIONS[v]}{not_applied}")
    rep.add()
    rows = []
    for i, spec in enumerate(specs):
        base = results[variants[0], i]
        for v in variants:
            e = results[v, i]
            tps = list(e.tps.values())
            if e.error or not tps:
                rows.append([spec.shape, spec.name, v, e.error or "failed", "", "", "", ""])
                continue
            rows.append(
                [
                    spec.shape,
                    spec.name,
                    v,
                    fmt(median(tps)),
                    fmt_range(tps),
                    fmt(100 * median(list(e.mfu.values())), 1),
                    f"{fmt(paired_ratio(e.tps, base.tps), 2)}x",
                    fmt(median(list(e.faults.values()))),
                ]
            )
    rep.table(
        ["shape", "contestant", "malloc", "tokens/s", "range", "MFU %", "speed-up", "page faults/step"], rows
    )
    for v in variants:
        char = [results[v, i] for i, spec in enumerate(specs) if spec.shape == "char"]
        headroom_note(rep, char, f"Char shape, allocator {v}. ")
    if peak_rss:
        rep.add(
            "Peak resident memory of each process (all its contestants' models and optimizer states "
            "live at once): "
            + ", ".join(f"{v} {peak_rss[v]:,.0f} MiB" for v in variants if v in peak_rss)
            + "."
        )
        rep.add()
    if many > 1:
        rows = []
        for i, spec in enumerate(specs):
            if spec.threads != many:
                continue
            j = next((k for k, s in enumerate(specs) if s == replace(spec, threads=1)), None)
            if j is None:
                continue
            for v in variants:
                ratio = paired_ratio(results[v, i].tps, results[v, j].tps)
                rows.append([spec.name, v, f"{fmt(ratio, 2)}x"])
        rep.add(f"{many} threads vs 1 thread, same process and allocator setting:")
        rep.add()
        rep.table(["contestant", "malloc", f"{many} threads / 1 thread"], rows)
