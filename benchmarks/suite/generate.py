"""Section 4, generation: batch-1 greedy decoding, ours with and without the KV cache, and the peer's."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

import torch

from minigpt.model import GPT, generate, optimize_for_decoding

from .peer import load_peer, load_peer_kv
from .report import fmt, fmt_range
from .settings import State
from .shapes import Shape, shapes
from .stats import median, now, paired_ratio, rotated

log = logging.getLogger(__name__)

HEADERS = [
    "context",
    "prompt",
    "generator",
    "tokens/s",
    "range",
    "vs peer no cache",
    "vs plain cache",
    "vs peer cache",
]


@dataclass
class GenEntry:
    """A generator at one context length, and its speed and output per repeat."""

    label: str
    context: int
    prompt_len: int
    fn: Callable[[], torch.Tensor]
    tps: dict[int, float] = field(default_factory=dict)
    outputs: list[torch.Tensor] = field(default_factory=list)


def peer_cached_generate(
    model: torch.nn.Module, kv_utils: ModuleType, idx: torch.Tensor, new: int
) -> torch.Tensor:
    """Greedy decoding with the peer's KV cache.

    The package's own ``kv_cache.generate.generate_text_simple`` calls the GPT-2 model without
    ``use_cache=True``, so with that model every step sees only the newest token. This loop
    passes the flag, which is how the model is meant to be called.
    """
    with torch.no_grad():
        cache = kv_utils.KVCache(n_layers=len(model.trf_blocks))
        model.current_pos = 0
        logits = model(idx, use_cache=True, cache=cache)
        for _ in range(new):
            next_id = logits[:, -1].argmax(dim=-1, keepdim=True)
            idx = torch.cat([idx, next_id], dim=1)
            logits = model(next_id, use_cache=True, cache=cache)
    return idx


@torch.inference_mode()
def plain_cached_generate(model: GPT, idx: torch.Tensor, new: int) -> torch.Tensor:
    """Greedy decoding with a KV cache written the straightforward way, as the peers' caches are:
    the model's own forward (all positions through the LM head) on its training layout. The
    reference our decoding path is measured against. Needs prompt + new <= context."""
    caches = model.new_kv_caches(idx.shape[0])
    logits = model(idx, caches)
    for _ in range(new):
        next_id = logits[:, -1].argmax(dim=-1, keepdim=True)
        idx = torch.cat([idx, next_id], dim=1)
        logits = model(next_id, caches)
    return idx


def build_entries(shape: Shape, new: int) -> list[GenEntry]:
    """Every generator at the shape's context and at twice it, on the same prompt per context."""
    peer = load_peer()
    peer_kv = load_peer_kv()
    entries: list[GenEntry] = []
    for context in (shape.context, 2 * shape.context):
        # At the shape's context the window slides for the last tokens; at twice it everything fits.
        prompt_len = max(8, shape.context + 8 - new) if context == shape.context else 8
        g = torch.Generator().manual_seed(7)
        prompt = torch.randint(shape.vocab, (1, prompt_len), generator=g)
        torch.manual_seed(0)
        trained = GPT(shape.gpt_config(context)).eval()
        decoding = optimize_for_decoding(copy.deepcopy(trained))
        for label, model, cache in (
            ("ours, KV cache (generate.py)", decoding, True),
            ("ours, no cache", decoding, False),
            ("ours, KV cache, training layout", trained, True),
        ):
            entries.append(
                GenEntry(
                    label,
                    context,
                    prompt_len,
                    lambda m=model, p=prompt, c=cache: generate(m, p, new, temperature=0.0, use_cache=c),
                )
            )
        if prompt_len + new <= context:
            entries.append(
                GenEntry(
                    "plain KV cache (model forward, training layout)",
                    context,
                    prompt_len,
                    lambda m=trained, p=prompt: plain_cached_generate(m, p, new),
                )
            )
        if peer is None:
            continue
        torch.manual_seed(0)
        peer_model = peer.GPTModel(shape.peer_config(context)).eval()
        entries.append(
            GenEntry(
                "peer, no cache (generate_text_simple)",
                context,
                prompt_len,
                lambda m=peer_model, p=prompt, c=context: peer.generate_text_simple(m, p, new, c),
            )
        )
        # The peer's cache has no sliding window: it can only run while everything fits.
        if peer_kv is not None and prompt_len + new <= context:
            gpt2, kv_utils = peer_kv
            kv_model = gpt2.GPTModel(shape.peer_config(context)).eval()
            # Same weights as the uncached peer (its mask buffer has no counterpart here).
            kv_model.load_state_dict(peer_model.state_dict(), strict=False)
            entries.append(
                GenEntry(
                    "peer, KV cache (kv_cache.gpt2)",
                    context,
                    prompt_len,
                    lambda m=kv_model, u=kv_utils, p=prompt: peer_cached_generate(m, u, p, new),
                )
            )
    return entries


def run(state: State) -> None:
    settings, rep = state.settings, state.report
    shape = shapes()["small"]
    new = settings.new_tokens
    log.info("[generate] building models")
    entries = build_entries(shape, new)
    failed: list[str] = []
    for e in list(entries):
        try:
            e.fn()  # warm-up
        except Exception as error:  # a peer's code path that does not run: report it, keep going
            failed.append(f"- {e.label} (context {e.context}) fails: `{type(error).__name__}: {error}`")
            entries.remove(e)
    for r in range(settings.repeats):
        log.info(f"[generate] repeat {r + 1}/{settings.repeats}")
        for e in rotated(entries, r):
            start = now()
            out = e.fn()
            e.tps[r] = new / (now() - start)
            e.outputs.append(out)
            log.info(f"  [{r}] context {e.context} {e.label}: {e.tps[r]:,.1f} tok/s")

    rep.add("## 4. Generation")
    rep.add()
    rep.add(
        f"Batch 1, {new} new tokens, greedy, fp32, {torch.get_num_threads()} threads, small shape "
        f"(vocabulary {shape.vocab}) with random weights. With context {shape.context} the window "
        "slides once prompt + generated tokens exceed it (our KV cache is then rebuilt each step; "
        "the peer's cache cannot slide, so it has no row there); with context "
        f"{2 * shape.context} everything fits. generate.py "
        "runs the first row: the model re-laid out by `optimize_for_decoding`, and the LM head as "
        "`LastTokenHead` (both in `model/generation.py`). The third row is the same cache on the "
        "model as it comes from training. 'plain KV cache' is a straightforward cached loop (the "
        "model's forward with full logits each step), the way the peers' caches work. Speed-ups "
        "are median per-repeat ratios."
    )
    rep.add()
    if failed:
        rep.add("Rows left out because the contestant raised an error on its first run:")
        rep.add()
        for line in failed:
            rep.add(line)
        rep.add()
    rows = []
    for context in (shape.context, 2 * shape.context):
        group = [e for e in entries if e.context == context]
        rows += context_rows(group)
        rep.add(agreement(context, group))
    rep.add()
    rep.table(HEADERS, rows)


def context_rows(group: list[GenEntry]) -> list[list[str]]:
    """The table rows of the generators at one context length, with their speed-ups."""
    peer_plain = next((e for e in group if e.label.startswith("peer, no cache")), None)
    peer_cached = next((e for e in group if e.label.startswith("peer, KV cache")), None)
    plain_cached = next((e for e in group if e.label.startswith("plain KV cache")), None)

    def versus(e: GenEntry, other: GenEntry | None) -> str:
        return f"{fmt(paired_ratio(e.tps, other.tps), 2)}x" if other else "n/a"

    rows = []
    for e in group:
        vals = list(e.tps.values())
        rows.append(
            [
                str(e.context),
                str(e.prompt_len),
                e.label,
                fmt(median(vals), 1),
                fmt_range(vals, 1),
                versus(e, peer_plain),
                versus(e, plain_cached),
                versus(e, peer_cached),
            ]
        )
    return rows


def agreement(context: int, group: list[GenEntry]) -> str:
    """Whether our generators, and the peer's two, produced the same tokens in every repeat."""
    ours = [e for e in group if not e.label.startswith("peer")]
    reference = ours[1].outputs[0]  # uncached
    same = all(torch.equal(out, reference) for e in ours for out in e.outputs)
    line = f"- context {context}: our rows produce {'**identical**' if same else '**DIFFERENT**'}"
    line += f" tokens in all {len(ours[0].outputs)} repeats"
    peer_plain = next((e for e in group if e.label.startswith("peer, no cache")), None)
    peer_cached = next((e for e in group if e.label.startswith("peer, KV cache")), None)
    if peer_plain and peer_cached:
        pairs = zip(peer_plain.outputs, peer_cached.outputs, strict=True)
        peer_same = all(torch.equal(a, b) for a, b in pairs)
        line += f"; the peer's cached and uncached tokens are {'identical' if peer_same else 'different'}"
    return line
