"""What several test modules of this folder, and others, share."""

from __future__ import annotations

import struct
from pathlib import Path

HEADER = "epoch,lr-AdamW/pg1,lr-AdamW/pg2,step,train_loss,val_loss,val_ppl\n"


FIRST = HEADER + (
    ",0.001,0.001,4,,,\n0,,,4,3.5,,\n"
    ",0.002,0.002,9,,,\n0,,,9,3.0,,\n0,,,9,,2.3,9.97\n"
    ",0.002,0.002,14,,,\n0,,,14,2.8,,\n0,,,14,,2.85,17.29\n"
    "0,,,19,,,\n0,,,19,2.7,,\n"
)


SECOND = HEADER + (
    ",0.0015,0.0015,14,,,\n0,,,14,2.6,,\n,0.001,0.001,19,,,\n0,,,19,2.5,,\n0,,,19,,2.4567,11.66\n"
)


CONFIG = """\
trainer:
  devices: 1
  num_nodes: 1
  accumulate_grad_batches: 2
model:
  gpt:
    context_length: 8
data:
  config:
    batch_size: 4
"""


def make_run(root: Path, config: str | None = CONFIG) -> Path:
    """A run folder as training leaves it, resumed once. Versions 9 and 10, so that a sort by name
    (which puts version_10 first) would join them in the wrong order."""
    run = root / "run"
    for number, text in ((9, FIRST), (10, SECOND)):
        version = run / "csv" / f"version_{number}"
        version.mkdir(parents=True)
        (version / "metrics.csv").write_text(text)
        if config is not None:
            (version / "config.yaml").write_text(config)
    return run


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])
