"""Section 5, data preparation: `minigpt.data.prepare` from raw text to the memmap, in MB/s."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .report import fmt, fmt_range
from .settings import State
from .stats import median, now, rotated

log = logging.getLogger(__name__)


def read_text(path: str | None) -> str | None:
    """The text the tokenizer-only row encodes: the built-in corpus, a .txt file, or None for other
    sources (which `prepare` reads itself)."""
    if path is None:
        from minigpt.data.shakespeare import shakespeare_path

        return shakespeare_path().read_text(encoding="utf-8")
    if Path(path).is_file() and Path(path).suffix == ".txt":
        return Path(path).read_text(encoding="utf-8")
    return None


def run(state: State) -> None:
    import datasets

    from minigpt.data import DataConfig, GPT2Tokenizer, prepare

    settings, rep = state.settings, state.report
    datasets.disable_progress_bars()
    config = DataConfig(source=settings.text or "shakespeare", tokenizer="gpt2")
    text = read_text(settings.text)
    tokenizer = GPT2Tokenizer()
    prep_mbs: dict[int, float] = {}
    enc_mbs: dict[int, float] = {}
    info: dict[str, Any] = {}

    def run_prepare(r: int) -> None:
        root = tempfile.mkdtemp(prefix="bench-prepare-")
        try:
            start = now()
            prepared = prepare(config, cache_root=root)
            seconds = now() - start
            info.update(prepared.meta)
            prep_mbs[r] = prepared.meta["text_bytes"] / 1e6 / seconds
            log.info(f"  [{r}] prepare: {prep_mbs[r]:.2f} MB/s")
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def run_encode(r: int) -> None:
        if text is None:
            return
        start = now()
        tokenizer.encode_to_arrays([text])
        enc_mbs[r] = len(text.encode("utf-8")) / 1e6 / (now() - start)
        log.info(f"  [{r}] tokenizer only: {enc_mbs[r]:.2f} MB/s")

    log.info("[data] preparing into fresh temporary caches")
    for r in range(settings.repeats):
        for run_one in rotated([run_prepare, run_encode], r):
            run_one(r)
    rep.add("## 5. Data preparation")
    rep.add()
    described = (
        "the built-in shakespeare corpus" if settings.text is None else f"`{Path(settings.text).name}`"
    )
    rep.add(
        f"`minigpt.data.prepare` with the GPT-2 tokenizer on {described} "
        f"({info.get('text_bytes', 0) / 1e6:.2f} MB, "
        f"{info.get('train_tokens', 0) + info.get('val_tokens', 0):,} tokens), each repeat into a fresh "
        "temporary cache folder: read, tokenize, write the memmaps. 'Tokenizer only' is "
        "`GPT2Tokenizer.encode_to_arrays` on the same text in memory."
    )
    rep.add()
    rows = [
        [
            "prepare() raw text -> memmap",
            fmt(median(list(prep_mbs.values())), 2),
            fmt_range(list(prep_mbs.values()), 2),
        ]
    ]
    if enc_mbs:
        rows.append(
            ["tokenizer only", fmt(median(list(enc_mbs.values())), 2), fmt_range(list(enc_mbs.values()), 2)]
        )
    rep.table(["stage", "MB/s", "range"], rows)
