"""The command lines: one module each for `train.py`, `generate.py` and `export.py`.

Each entry point is a typed description of its options (LightningCLI's signatures for training,
dataclasses for the others) parsed by jsonargparse, so every setting is declared and validated
once, documented in `--help`, and can come from a `--config` file. Errors a user can cause are
printed as one line, with exit code 2.
"""
