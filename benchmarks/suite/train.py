"""Section 2, training throughput: one full optimizer step of ours and the peer at each shape."""

from __future__ import annotations

import gc
from dataclasses import replace

from .contestants import OPTIM, TrainSpec
from .entries import TrainEntry, new_entries, run_interleaved
from .peer import load_peer
from .report import Report, fmt, fmt_range
from .settings import State
from .shapes import shapes
from .stats import median, paired_ratio

TRAIN_HEADERS = ["contestant", "tokens/s", "range", "MFU %", "speed-up", "page faults/step", "note"]


def quick_spec(spec: TrainSpec) -> bool:
    """The contestants --quick keeps: one of each kind."""
    if spec.skip_elementwise:
        return False
    if spec.impl == "ours":
        return spec.adamw == "fused" and (spec.loss == "full" or (spec.bf16 and spec.chunk == 256))
    if spec.impl == "peer":
        return spec.adamw == ("fused" if spec.bf16 else "default")
    return False


def train_specs(shape_name: str, chunks: tuple[int, ...]) -> list[TrainSpec]:
    """Every contestant of section 2 at one shape."""
    large_vocab = shapes()[shape_name].vocab > 1000  # where the LM head is most of the step (small)
    specs = [TrainSpec(shape_name, "ours", False)]
    if large_vocab:
        specs.append(TrainSpec(shape_name, "ours", False, "fused", 256))
    specs.append(TrainSpec(shape_name, "ours", True))
    specs.append(TrainSpec(shape_name, "ours", True, attention="sdpa"))
    if not large_vocab:
        specs.append(TrainSpec(shape_name, "ours", True, skip_elementwise=True))
    else:
        specs += [TrainSpec(shape_name, "ours", True, "fused", c) for c in chunks]
        specs.append(TrainSpec(shape_name, "ours", True, "fused", 256, adamw="default"))
    return specs + [
        TrainSpec(shape_name, "peer", False, adamw="default"),
        TrainSpec(shape_name, "peer", False),
        TrainSpec(shape_name, "peer", True, adamw="default"),
        TrainSpec(shape_name, "peer", True),
        TrainSpec(shape_name, "peer-fast", True),
    ]


def run(state: State) -> None:
    settings, rep = state.settings, state.report
    rep.add("## 2. Training throughput (one full optimizer step)")
    rep.add()
    rep.add(
        "Forward, loss, backward, AdamW step, zero_grad on a fixed random batch. "
        f"AdamW lr {OPTIM.lr}, betas ({OPTIM.beta1}, {OPTIM.beta2}), weight decay {OPTIM.weight_decay} "
        "for everyone (ours: `build_optimizer`, no decay on biases/norms). "
        "Model FLOPs per token = 6 x (matmul weights incl. LM head) + 12 x n_layer x n_embd x T "
        "(both models have the same matmul weights; the peer's LM head is untied). "
        "The peer's loss is `F.cross_entropy(logits.flatten(0, 1), y.flatten())`. "
        "Speed-up is against the peer's GPTModel in fp32 with AdamW's default (the book's setup), "
        "median of per-repeat ratios. Page faults are minor faults per step."
    )
    rep.add()
    for shape_name in settings.shapes:
        shape = shapes()[shape_name]
        batch = shape.batch_size(settings.batch_div)
        specs = train_specs(shape_name, settings.chunks)
        if load_peer() is None:
            specs = [s for s in specs if s.impl == "ours"]
        if settings.quick:
            specs = [s for s in specs if quick_spec(s)]
        entries = new_entries(specs, settings)
        run_interleaved(
            entries,
            settings,
            state.matmul,
            f"train {shape_name}",
            lambda r, shape=shape, b=batch: state.bound.measure("train", shape, b, r),
        )
        baseline = next(
            (e for e in entries if e.spec == TrainSpec(shape_name, "peer", False, adamw="default")), None
        )
        rep.add(
            f"### {shape_name}: vocab {shape.vocab}, context {shape.context}, {shape.n_layer} layers, "
            f"{shape.n_head} heads, {shape.n_embd} wide, batch {batch}"
        )
        rep.add()
        rep.add(
            f"{shape.matmul_params() / 1e6:.2f} M matmul weights, "
            f"{shape.flops_per_token() / 1e6:.1f} MFLOP per token, "
            f"{shape.flops_per_token() * batch * shape.context / 1e9:.1f} GFLOP per step."
        )
        rep.add()
        rep.table(TRAIN_HEADERS, train_rows(entries, baseline))
        fused = [
            e
            for e in entries
            if e.spec.impl == "ours" and e.spec.bf16 and e.spec.loss == "fused" and e.spec.adamw == "fused"
        ]
        fused = [e for e in fused if e.tps]
        if fused and shape_name == "small":
            state.best_chunk = max(fused, key=lambda e: median(list(e.tps.values()))).spec.chunk
            rep.add(f"Fastest fused-CE chunk on this run: {state.best_chunk} rows.")
            rep.add()
        headroom_note(rep, entries)
        for kind in ("ours", "peer"):
            timed = [
                e for e in entries if e.spec.impl.startswith(kind) and e.tps and not e.spec.skip_elementwise
            ]
            if timed:
                best = max(timed, key=lambda e: median(list(e.tps.values())))
                state.fastest[f"{shape_name} {kind}"] = (best.spec.name, "train", best.tps)
        for e in entries:
            e.release()
        gc.collect()


def train_rows(entries: list[TrainEntry], baseline: TrainEntry | None) -> list[list[str]]:
    rows = []
    for e in entries:
        if e.error:
            rows.append([e.label, "failed", "", "", "", "", e.error])
            continue
        tps = list(e.tps.values())
        ratio = paired_ratio(e.tps, baseline.tps) if baseline and baseline.tps else float("nan")
        rows.append(
            [
                e.label,
                fmt(median(tps)),
                fmt_range(tps),
                fmt(100 * median(list(e.mfu.values())), 1),
                f"{fmt(ratio, 2)}x",
                fmt(median(list(e.faults.values()))),
                "",
            ]
        )
    return rows


def headroom_note(rep: Report, entries: list[TrainEntry], where: str = "") -> None:
    """What the step without softmax, GELU and LayerNorm says about the fastest peer row."""
    timed = [e for e in entries if e.tps]
    bare = next((e for e in timed if e.spec.skip_elementwise), None)
    peers = [e for e in timed if e.spec.impl != "ours"]
    if bare is None or not peers:
        return
    whole = replace(bare.spec, skip_elementwise=False)
    ours = next((e for e in timed if e.spec == whole), None)
    if ours is None:
        return
    peer = max(peers, key=lambda e: median(list(e.tps.values())))
    rep.add(
        f"{where}Without softmax, GELU and LayerNorm (the row marked 'not a model': same matmuls, "
        f"embeddings, loss and optimizer), ours runs {fmt(paired_ratio(bare.tps, ours.tps), 2)}x "
        f"its full step, which would be {fmt(paired_ratio(bare.tps, peer.tps), 2)}x the fastest peer "
        f"row ({peer.label}); the full step is {fmt(paired_ratio(ours.tps, peer.tps), 2)}x it."
    )
    rep.add()
