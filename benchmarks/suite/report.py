"""The markdown report: printed to stdout as it grows, written to `--out` at the end."""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path


def fmt(value: float, digits: int = 0) -> str:
    if value != value:  # NaN
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_range(values: list[float], digits: int = 0) -> str:
    return f"{fmt(min(values), digits)}–{fmt(max(values), digits)}" if values else "n/a"


class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, text: str = "") -> None:
        self.lines.append(text)
        print(text, flush=True)

    def table(self, headers: list[str], rows: list[list[str]]) -> None:
        self.add("| " + " | ".join(headers) + " |")
        self.add("|" + "|".join("---" for _ in headers) + "|")
        for row in rows:
            self.add("| " + " | ".join(str(c) for c in row) + " |")
        self.add()

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    """The instruction-set extensions that decide matmul speed, as /proc/cpuinfo lists them."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                keep = [f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")]
                return " ".join(keep) or "none of avx2/avx512/amx"
    return "unknown"
