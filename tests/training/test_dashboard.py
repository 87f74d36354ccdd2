"""The attention maps a run draws in the background are the maps of the weights they name."""

from __future__ import annotations

from pathlib import Path

from minigpt.cli.train import train_main
from minigpt.cli.visualize import visualize_main
from minigpt.training.dashboard import AttentionMaps

from .conftest import tiny_args


def test_maps_drawn_in_the_background_are_the_last_validations(corpus: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert AttentionMaps().background  # what the configs use
    assert (
        train_main(tiny_args(corpus, run, "--trainer.max_steps", "10", "--trainer.val_check_interval", "5"))
        == 0
    )
    drawn = {path.name: path.read_bytes() for path in (run / "attention").iterdir()}
    assert sorted(drawn) == ["layer0.png", "layer1.png"]  # written whole: no temporary file left
    # The run's last validation was at its last step: visualize.py draws the same from its weights.
    checkpoint = run / "checkpoints" / "last.ckpt"
    prompt = AttentionMaps().prompt
    assert (
        visualize_main(["--checkpoint", str(checkpoint), "--prompt", prompt, "--out", str(tmp_path / "maps")])
        == 0
    )
    again = {path.name: path.read_bytes() for path in (tmp_path / "maps").iterdir()}
    assert again == drawn
