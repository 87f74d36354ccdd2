"""The commands that only read a model start without Lightning, whose import is about half of
their start-up time; only training needs it."""

import subprocess
import sys

import pytest

READERS = ["generate", "export", "visualize", "evaluate", "serve"]


@pytest.mark.slow
def test_commands_that_read_a_model_do_not_import_lightning() -> None:
    imports = "; ".join(f"import minigpt.cli.{name}" for name in READERS)
    check = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'lightning')[:3])"
    out = subprocess.run(
        [sys.executable, "-c", f"{imports}; {check}"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
