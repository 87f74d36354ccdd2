"""Evaluation results as a table for people and a JSON file for diffing: what was scored, how, by
which versions, and every figure with its standard error and count."""

from __future__ import annotations

import json
import platform
import shlex
import sys
from dataclasses import asdict
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from minigpt.common import safe_write

from .lm_eval import Score


def versions() -> dict[str, str]:
    """The versions that decide the figures: Python, minigpt, torch and, where installed, lm-eval."""
    found = {"python": platform.python_version()}
    for package in ("minigpt", "torch", "lm_eval", "datasets"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return found


def table(rows: list[Score]) -> str:
    """The rows as an aligned text table."""
    lines = [("task", "metric", "value", "stderr", "n")]
    for r in rows:
        lines.append(
            (r.task, r.metric, f"{r.value:.4f}", "-" if r.stderr is None else f"{r.stderr:.4f}", f"{r.n:,}")
        )
    widths = [max(len(line[i]) for line in lines) for i in range(5)]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


def write_results(
    path: Path, model: str, rows: list[Score], settings: dict[str, Any], argv: list[str]
) -> Path:
    """Write the JSON file (atomically): the model, the exact command, the versions, the settings
    and every row. Keys are sorted and the rows keep their order, so two files diff line by line.
    A full disk or a folder not the user's raises WriteError, leaving the file there as it was."""
    document = {
        "model": model,
        "command": shlex.join([Path(sys.argv[0]).name if sys.argv[0] else "evaluate.py", *argv]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": versions(),
        "settings": settings,
        "results": [asdict(row) for row in rows],
    }
    with safe_write(path) as tmp:
        tmp.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
