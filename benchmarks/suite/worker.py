"""The alloc section's subprocesses: each runs contestants under its own allocator setting.

An allocator setting must be applied before the process's big allocations, so each setting gets
a fresh process (`bench.py --worker VARIANT`). The parent drives it one timed block at a time over
stdin/stdout: JSON commands in, JSON replies out, marked so that nothing else a library prints
can be taken for a reply.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from .contestants import TrainSpec
from .entries import TrainEntry
from .malloc import apply_variant
from .probes import Matmul
from .settings import Settings

WORKER_MARK = "@@bench "
BENCH_SCRIPT = Path(__file__).resolve().parents[1] / "bench.py"


class Worker:
    """A benchmark subprocess with its own allocator settings, driven one timed block at a time."""

    def __init__(self, variant: str, batch_div: int) -> None:
        self.variant = variant
        command = [sys.executable, str(BENCH_SCRIPT), "--worker", variant]
        command += ["--threads", str(torch.get_num_threads()), "--batch-div", str(batch_div)]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def call(self, **message: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(WORKER_MARK):
                return json.loads(line[len(WORKER_MARK) :])
        raise RuntimeError(f"worker {self.variant} exited with code {self.proc.wait()}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call(cmd="quit")
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=30)
        if self.proc.poll() is None:
            self.proc.kill()


def peak_rss_of_this_process() -> float:
    """VmHWM in MiB (ru_maxrss would include the parent's peak, which Linux carries across exec)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker_main(settings: Settings) -> None:
    """Subprocess side of Worker: JSON commands on stdin, marked JSON replies on stdout."""
    assert settings.worker is not None
    problem = apply_variant(settings.worker)  # a second time is harmless; gets the error message
    torch.set_num_threads(settings.threads)
    reply_to = sys.stdout
    sys.stdout = sys.stderr  # anything else printed must not be mistaken for a reply
    matmul = Matmul()
    entries: list[TrainEntry] = []

    def reply(**message: Any) -> None:
        reply_to.write(WORKER_MARK + json.dumps(message) + "\n")
        reply_to.flush()

    for line in sys.stdin:
        message = json.loads(line)
        if message["cmd"] == "build":
            specs = [TrainSpec(**s) for s in message["specs"]]
            entries = [TrainEntry(spec, default_threads=settings.threads) for spec in specs]
            for entry in entries:
                if not problem:
                    entry.prepare(message["warmup"], settings.batch_div)
            reply(problem=problem, errors=[problem or e.error for e in entries])
        elif message["cmd"] == "run":
            entry = entries[message["index"]]
            r = message["repeat"]
            entry.measure(r, message["steps"], matmul)
            peak_rss_mib = peak_rss_of_this_process()
            reply(tps=entry.tps.get(r), mfu=entry.mfu.get(r), faults=entry.faults.get(r), rss=peak_rss_mib)
        elif message["cmd"] == "quit":
            reply()
            return
