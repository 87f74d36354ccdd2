#!/usr/bin/env python
"""minigpt performance benchmark: matmul peak, training throughput and MFU, Lightning overhead,
generation speed and data preparation, against the reference GPT of "Build a Large Language Model
(From Scratch)" (the ``llms-from-scratch`` package) where it has a counterpart.

CPU speed on shared or virtual machines drifts, sometimes within seconds. So every section
*interleaves* its contestants: each repeat runs one timed block of every contestant (the order
rotates between repeats), and tables show medians over the repeats. Speed-ups are the median of
the per-repeat ratios, which cancels most of the drift. Each training block is preceded by a
short matmul probe in the same precision and thread count; MFU is measured against that probe.

This file parses the command line, runs the chosen sections and writes the report; the sections
live in ``suite/``, one module each. Run ``python benchmarks/bench.py --help`` for the options;
``--quick`` is a one-minute smoke run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import logging
import os
import platform
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from suite import alloc, bound, data, generate, lightning, matmul, train
from suite import compile as torch_compile
from suite.malloc import MALLOC_DESCRIPTIONS, MALLOC_VARIANTS, apply_variant
from suite.peer import PEER_PACKAGE, load_peer, peer_version
from suite.report import Report, cpu_flags, cpu_model
from suite.settings import Settings, State
from suite.shapes import shapes
from suite.stats import LoadMeter, now, use_threads
from suite.worker import worker_main

log = logging.getLogger("suite")

SECTIONS: dict[str, Callable[[State], None] | None] = {
    "data": data.run,
    "matmul": None,  # probed throughout the run and reported first, once every probe is in (run_sections)
    "train": train.run,
    "alloc": alloc.run,
    "bound": bound.run,
    "compile": torch_compile.run,
    "lightning": lightning.run,
    "generate": generate.run,
}
"""Every section, in run order. data goes first: datasets.map forks worker processes, and forking a
process that already holds gigabytes of models is slower than the fresh train.py process a user
prepares in. alloc also covers thread counts, in the same interleaved grid."""


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="timed blocks per contestant (default 5; quick 1)"
    )
    p.add_argument(
        "--steps", type=int, default=None, help="training steps per timed block (default 2; quick 1)"
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed training steps per contestant (default 1)")
    p.add_argument(
        "--quick", action="store_true", help="~1 minute smoke run: batch / 4, few contestants, no compile"
    )
    p.add_argument(
        "--only", default=None, help=f"comma-separated sections to run (default all): {', '.join(SECTIONS)}"
    )
    p.add_argument(
        "--shapes", default="small,char", help="training shapes for section 2 (default small,char)"
    )
    p.add_argument(
        "--chunks", default=None, help="fused-CE chunk_rows to try (default 128,256,512,1024; quick 256)"
    )
    p.add_argument(
        "--malloc",
        default=None,
        help=f"allocator settings to compare: {', '.join(MALLOC_VARIANTS)} (default: all; quick: 2)",
    )
    p.add_argument(
        "--allocator",
        default="default",
        choices=list(MALLOC_VARIANTS),
        help="glibc malloc setting of the main process, i.e. every section but alloc (default: default)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens to generate (default 200; quick 24)")
    p.add_argument(
        "--text", default=None, help="text file for section 5 (default: the built-in shakespeare corpus)"
    )
    p.add_argument("--out", default=None, help="also write the markdown report to this file")
    p.add_argument("--batch-div", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", default=None, choices=list(MALLOC_VARIANTS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick

    def names(value: str, known: dict, what: str) -> tuple[str, ...]:
        chosen = tuple(s.strip() for s in value.split(",") if s.strip())
        for name in chosen:
            if name not in known:
                p.error(f"unknown {what} {name!r}; choose from {', '.join(known)}")
        return chosen

    if args.only:
        sections = names(args.only, SECTIONS, "section")
    else:  # a cold compile alone takes about a minute
        sections = tuple(s for s in SECTIONS if not (quick and s == "compile"))
    chunks = args.chunks or ("256" if quick else "128,256,512,1024")
    malloc = args.malloc or ("default,tuned" if quick else ",".join(MALLOC_VARIANTS))
    return Settings(
        sections=sections,
        repeats=args.repeats or (1 if quick else 5),
        steps=args.steps or (1 if quick else 2),
        warmup=args.warmup,
        batch_div=args.batch_div or (4 if quick else 1),
        threads=args.threads or torch.get_num_threads(),
        quick=quick,
        shapes=names(args.shapes, shapes(), "shape"),
        chunks=tuple(int(c) for c in chunks.split(",") if c),
        malloc=names(malloc, MALLOC_VARIANTS, "malloc setting"),
        allocator=args.allocator,
        new_tokens=args.new_tokens or (24 if quick else 200),
        text=args.text,
        out=args.out,
        worker=args.worker,
    )


def show_progress(quiet: bool) -> None:
    """Progress goes to stderr so stdout holds only the report; a worker's stays silent, since the
    parent reports its blocks."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False


def write_header(report: Report, settings: Settings, allocator_problem: str, argv: list[str] | None) -> None:
    libc = " ".join(platform.libc_ver())
    report.add(f"# minigpt benchmark — {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}")
    report.add()
    report.add(f"- CPU: {cpu_model()} ({os.cpu_count()} logical cores; {cpu_flags()})")
    report.add(
        f"- torch {torch.__version__}, {torch.get_num_threads()} threads; lightning "
        f"{importlib.metadata.version('lightning')}; python {platform.python_version()}; {libc}"
    )
    report.add(f"- peer: {PEER_PACKAGE} {peer_version()}")
    report.add(
        f"- allocator of the main process: {settings.allocator} ({MALLOC_DESCRIPTIONS[settings.allocator]})"
        + (f" — NOT APPLIED: {allocator_problem}" if allocator_problem else "")
    )
    with contextlib.suppress(OSError):
        report.add("- load average at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    blocks = f"{settings.repeats} repeats x {settings.steps} steps per timed block"
    report.add(
        f"- {blocks}, {settings.warmup} warm-up step(s)"
        + (f", batch / {settings.batch_div} (--quick)" if settings.batch_div > 1 else "")
    )
    report.add(
        f"- command: `python benchmarks/bench.py {shlex.join(sys.argv[1:] if argv is None else argv)}`"
    )
    report.add()


def run_sections(state: State) -> None:
    """Run the chosen sections in order; one that fails is reported and the others still run."""
    settings, report = state.settings, state.report
    if "matmul" in settings.sections and "train" not in settings.sections:
        matmul.run_rounds(state)
    body_start = len(report.lines)
    for name in settings.sections:
        section = SECTIONS[name]
        if section is None:
            continue
        t = now()
        use_threads(settings.threads)
        meter = LoadMeter()
        try:
            section(state)
        except Exception as error:  # one broken section must not lose the others
            report.add(f"## {name}: FAILED — {type(error).__name__}: {error}")
            report.add()
        load = meter.summary()
        if load:
            report.add(load)
            report.add()
        log.info(f"[{name}] done in {now() - t:.0f} s")
    if "matmul" in settings.sections:
        # The peak table goes first but is written last, once every probe has been taken.
        lines, report.lines = report.lines, report.lines[:body_start]
        matmul.report(state)
        report.lines += lines[body_start:]


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    # Before any big allocation: the setting only applies to memory allocated afterwards.
    allocator_problem = apply_variant(settings.worker or settings.allocator)
    show_progress(quiet=settings.worker is not None)
    use_threads(settings.threads)
    if settings.worker:
        worker_main(settings)
        return

    started = now()
    state = State(settings, Report())
    load_peer()
    write_header(state.report, settings, allocator_problem, argv)
    run_sections(state)
    state.report.add(f"_Total benchmark time: {(now() - started) / 60:.1f} min._")
    if settings.out:
        Path(settings.out).write_text(state.report.text(), encoding="utf-8")
        log.info(f"wrote {settings.out}")


if __name__ == "__main__":
    main()
