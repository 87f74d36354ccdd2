"""Section 2b, the matmul bound: how fast a step could be if it were nothing but its matrix products.

The rounds themselves are taken by the train and alloc sections, next to their timed blocks
(`probes.MatmulBound`); this section measures them only where train did not run, and reports.
"""

from __future__ import annotations

import logging

import torch

from .probes import PROBE_SHAPE
from .report import fmt, fmt_range
from .settings import State
from .shapes import shapes
from .stats import median, paired_ratio

log = logging.getLogger(__name__)


def run(state: State) -> None:
    settings, rep, bound = state.settings, state.report, state.bound
    batches = {name: shape.batch_size(settings.batch_div) for name, shape in shapes().items()}
    for name in settings.shapes:
        if not bound.totals("train", name):  # section 2 did not run: measure here
            for r in range(settings.repeats):
                log.info(f"[bound] {name} repeat {r + 1}/{settings.repeats}")
                state.matmul.probe("bf16")
                bound.measure("train", shapes()[name], batches[name], r)
    rep.add("## 2b. The matmul bound")
    rep.add()
    rep.add(
        "Every matrix product of one training step at each shape (`step_matmuls`), timed alone in "
        "bf16 on preallocated operands and outputs (no allocation, no casts, no page faults), best "
        "of 3 per product. Their sum is a floor on the step time of *any* implementation that uses "
        "PyTorch's CPU matmuls, so tokens per step / sum is a ceiling on its tokens/s. The flash "
        "attention kernel's recomputation, the loss, the norms, the optimizer and the casts are "
        "left out, which only makes the ceiling higher. One round per repeat, taken at the start "
        "of each repeat of section 2 (and of the allocator section), so that it sees the same "
        "phases of the machine as the timed steps it is compared with; medians over the rounds. "
        "Ceiling MFU is against the median bf16 probe of the run."
    )
    rep.add()
    probes = state.matmul.samples.get((PROBE_SHAPE, "bf16", torch.get_num_threads()), [])
    peak = median(probes)
    rows = []
    for name in settings.shapes:
        shape = shapes()[name]
        rounds = bound.rounds.get(("train", name), {})
        totals = list(bound.totals("train", name).values())
        if not totals:
            continue
        kinds = {
            what: median([parts[what] for parts in rounds.values()]) for what in next(iter(rounds.values()))
        }
        total = median(totals)
        ceilings = list(bound.ceilings("train", shape, batches[name]).values())
        flops = shape.flops_per_token() * batches[name] * shape.context
        parts = ", ".join(f"{k} {1e3 * v:.0f}" for k, v in kinds.items())
        rows.append(
            [
                name,
                f"{1e3 * total:.0f} ({parts})",
                fmt(median(ceilings)),
                fmt_range(ceilings),
                fmt(100 * flops / total / 1e9 / peak, 1),
                str(len(totals)),
            ]
        )
    rep.table(
        [
            "shape",
            "matmul ms per step (by layer kind)",
            "ceiling tokens/s",
            "range",
            "ceiling MFU %",
            "rounds",
        ],
        rows,
    )
    rows = []
    for key, (label, section, tps) in state.fastest.items():
        name = key.split()[0]
        ceilings = bound.ceilings(section, shapes()[name], batches[name])
        share = paired_ratio(tps, ceilings)
        if share == share:  # not NaN: the bound was measured next to these blocks
            rows.append(
                [name, label, fmt(median(list(tps.values()))), fmt(100 * share, 0), f"{fmt(1 / share, 2)}x"]
            )
    if rows:
        rep.add(
            "The fastest of ours and of the peer in each measurement above (section 2 in the main "
            "process's allocator setting, the lever table per setting) against the ceiling, as the "
            "median over repeats of tokens/s / the ceiling measured in the same repeat. The last "
            "column is the largest speed-up over that row any implementation could reach with these "
            "kernels."
        )
        rep.add()
        rep.table(["shape", "fastest", "tokens/s", "% of ceiling", "ceiling / this"], rows)
