"""Preparing a corpus larger than memory: peak RSS, MB/s, and a SIGKILL halfway then a resume.

Generates a local corpus of ``--gb`` GB of text (``.jsonl`` files of documents made of English-like
words: GPT-2 tokens drawn with a Zipf law, seeded), then prepares it with GPT-2 tokens through
``minigpt.data.prepare`` in a child process, watching it. The first child is killed with SIGKILL
once ``--kill-at`` of the text sits in finished shards; a second child resumes. Each child's peak
RSS comes from ``wait4``. The shards finished before the kill must come out of the resumed run as
the same files (same inode and modification time): they were not written again.

    python benchmarks/prepare_scale.py --gb 2 --out prepare_scale.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from minigpt.data import DataConfig, load_gpt2_encoding
from minigpt.data.prepare import _locate, partial_folder

FILE_BYTES = 64 << 20  # one .jsonl file per 64 MB of text


def generate(folder: Path, total_bytes: int, seed: int) -> int:
    """Write ``total_bytes`` of documents into ``folder/*.jsonl``; return the text bytes written."""
    encoding = load_gpt2_encoding()
    words = [w for w in (encoding.decode([i]) for i in range(encoding.eot_token)) if w[1:].isalpha()]
    words = [w for w in words if w.startswith(" ") and w[1:].isascii() and w[1:].islower()]
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(words) + 1)  # Zipf: GPT-2's ids roughly follow frequency
    weights /= weights.sum()
    # A pool of sentences, then documents as random runs of them: fast, and varied enough for BPE.
    vocabulary = np.array(words)
    picks = vocabulary[rng.choice(len(words), 50_000 * 24, p=weights)].reshape(50_000, 24)
    pool = ["".join(row[: rng.integers(6, 25)]).strip().capitalize() + "." for row in picks]
    folder.mkdir(parents=True)
    written, index = 0, 0
    while written < total_bytes:
        with open(folder / f"part-{index:04d}.jsonl", "w", encoding="utf-8") as out:
            in_file = 0
            while in_file < FILE_BYTES and written < total_bytes:
                sentences = rng.integers(0, len(pool), rng.integers(20, 400))
                text = " ".join(pool[i] for i in sentences)
                out.write(f'{{"text": "{text}"}}\n')  # plain letters, spaces and dots: no escaping needed
                in_file += len(text)
                written += len(text)
        index += 1
    return written


def prepare_child(source: Path, cache: Path, shard_tokens: int) -> subprocess.Popen:
    script = (
        "from minigpt.data import DataConfig, prepare;"
        f"prepare(DataConfig(source={str(source)!r}, shard_tokens={shard_tokens}), {str(cache)!r})"
    )
    return subprocess.Popen([sys.executable, "-c", script])


def watch(child: subprocess.Popen, progress: Path, kill_bytes: int | None) -> tuple[int, float, int]:
    """Wait for ``child`` (SIGKILL it once ``progress`` records ``kill_bytes`` of finished text);
    return its exit status, seconds and peak RSS in bytes."""
    start = time.perf_counter()
    while kill_bytes is not None:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            return status, time.perf_counter() - start, usage.ru_maxrss * 1024
        try:
            done = json.loads(progress.read_text())["text_bytes"]
        except (OSError, ValueError, KeyError):
            done = 0
        if done >= kill_bytes:
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.2)
    _, status, usage = os.wait4(child.pid, 0)
    return status, time.perf_counter() - start, usage.ru_maxrss * 1024


def shard_files(folder: Path) -> dict[str, tuple[int, int]]:
    """Raw or final shard index -> (inode, mtime_ns) of the files in ``folder``."""
    return {p.stem.split("-")[1]: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.glob("*-0*.bin")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0, help="GB of text to generate")
    parser.add_argument("--shard_tokens", type=int, default=1 << 24, help="tokens per shard")
    parser.add_argument(
        "--kill_at", type=float, default=0.5, help="share of the text finished at the SIGKILL"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="prepare_scale-"))
    try:
        start = time.perf_counter()
        text_bytes = generate(work / "corpus", int(args.gb * 1e9), args.seed)
        print(f"generated {text_bytes / 1e9:.2f} GB in {time.perf_counter() - start:.0f} s", flush=True)
        config = DataConfig(source=str(work / "corpus"), shard_tokens=args.shard_tokens)
        _, directory = _locate(config, work / "cache")
        partial = partial_folder(directory)

        first = prepare_child(work / "corpus", work / "cache", args.shard_tokens)
        status1, seconds1, rss1 = watch(first, partial / "progress.json", int(args.kill_at * text_bytes))
        killed = os.WIFSIGNALED(status1) and os.WTERMSIG(status1) == signal.SIGKILL
        at_kill = json.loads((partial / "progress.json").read_text())
        before = shard_files(partial)
        print(f"killed: {killed} after {seconds1:.0f} s with {len(before)} shards finished", flush=True)

        second = prepare_child(work / "corpus", work / "cache", args.shard_tokens)
        status2, seconds2, rss2 = watch(second, partial / "progress.json", None)
        if status2 != 0:
            raise SystemExit(f"the resumed preparation failed (status {status2})")
        meta = json.loads((directory / "meta.json").read_text())
        after = shard_files(directory)
        kept = sum(after.get(k) == v for k, v in before.items())
        total = meta["train_tokens"] + meta["val_tokens"]
        rows = [
            ("text", f"{text_bytes / 1e9:.2f} GB in {len(list((work / 'corpus').iterdir()))} .jsonl files"),
            ("tokens", f"{total:,} GPT-2 tokens in {len(meta['shards'])} shards of {args.shard_tokens:,}"),
            (
                "first run, SIGKILLed",
                f"{seconds1:.0f} s, {len(before)} shards finished, peak RSS {rss1 / 2**20:,.0f} MiB",
            ),
            ("resumed run", f"{seconds2:.0f} s, peak RSS {rss2 / 2**20:,.0f} MiB"),
            ("shards kept from the first run", f"{kept} of {len(before)} (same inode and mtime)"),
            (
                "resumed run read on from",
                f"document {at_kill['documents']:,}, token {sum(at_kill['shard_tokens']):,}",
            ),
            ("throughput, both runs", f"{text_bytes / 1e6 / (seconds1 + seconds2):.1f} MB/s of text"),
            (
                "throughput, resumed run",
                f"{(text_bytes - at_kill['text_bytes']) / 1e6 / seconds2:.1f} MB/s"
                " (skipping the consumed documents included)",
            ),
        ]
        now = datetime.datetime.now(datetime.UTC)
        report = "\n".join(
            [
                f"# Preparing {args.gb:g} GB of text — {now:%Y-%m-%d %H:%M} UTC",
                "",
                f"- {platform.machine()}, {os.cpu_count()} cores; python {platform.python_version()}",
                f"- command: `python {shlex.join(['benchmarks/prepare_scale.py', *sys.argv[1:]])}`",
                "",
                "| measure | value |",
                "|---|---|",
                *(f"| {name} | {value} |" for name, value in rows),
            ]
        )
        print(report)
        if args.out:
            args.out.write_text(report + "\n", encoding="utf-8")
        if not killed or kept != len(before):
            raise SystemExit("the interrupted preparation did not resume from its finished shards")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
