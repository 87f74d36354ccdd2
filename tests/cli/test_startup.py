"""Each command imports only what it uses, so it answers soon after `import torch` (train.py: after
`import lightning.pytorch`). Checked by the modules a fresh interpreter holds after importing the
command and asking for its --help, not by wall time, which a busy machine makes noisy:
benchmarks/startup.py times them."""

import json
import subprocess
import sys

import pytest

READERS = [
    "generate",
    "chat",
    "export",
    "visualize",
    "report",
    "evaluate",
    "serve",
    "train_tokenizer",
    "play_questions",
]
"""The commands that need no Lightning."""
HEAVY = [
    "lightning",  # ~4 s with torchmetrics: training only
    "torchmetrics",
    "matplotlib",  # ~0.3 s: drawing, after the options are parsed
    "datasets",  # ~0.8 s: reading a corpus
    "huggingface_hub",
    "pandas",
    "wandb",  # ~0.5 s: the training logger
    "transformers",  # tests and torchmetrics only
    "lm_eval",  # evaluate.py --tasks
    "fastapi",  # serve.py, once the options are parsed
    "uvicorn",
    "torch.distributed.checkpoint",  # ~1 s: reading FSDP shards
]
"""Modules that cost a tenth of a second or more to import, and what needs each."""


def modules_added(commands: list[str], after: str) -> dict[str, list[str]]:
    """For each command (`generate`: minigpt.cli.generate's generate_main), imported and asked for
    its `--help` in turn in a fresh interpreter after `after`, the modules of HEAVY it added. The
    help counts: parsing options reads the option classes' modules (jsonargparse even runs their
    `if TYPE_CHECKING:` imports)."""
    script = f"""
import contextlib, importlib, io, json, sys
import {after}
heavy = {HEAVY!r}
loaded = lambda: {{h for h in heavy if h in sys.modules}}
seen, added = loaded(), {{}}
for name in {commands!r}:
    main = getattr(importlib.import_module("minigpt.cli." + name), name + "_main")
    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
        main(["--help"])
    added[name] = sorted(loaded() - seen)
    seen = loaded()
print(json.dumps(added))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.slow
def test_commands_that_read_a_model_import_nothing_heavy() -> None:
    added = modules_added(READERS, after="torch")
    assert {name: mods for name, mods in added.items() if mods} == {}


@pytest.mark.slow
def test_train_imports_nothing_heavy_beyond_lightning() -> None:
    added = modules_added(["train"], after="lightning.pytorch")
    assert added == {"train": []}
