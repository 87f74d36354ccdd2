"""What a run shows after each validation, drawn beside the training loop, is what the loop itself
would have shown: the attention maps of the weights they name, the same sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from minigpt.cli.train import train_main
from minigpt.cli.visualize import visualize_main
from minigpt.training.callbacks.background import Job
from minigpt.training.callbacks.dashboard import AttentionMaps

from .conftest import REPO, tiny_args


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


def test_a_sample_drawn_in_the_background_is_the_one_drawn_in_the_loop(corpus: Path, tmp_path: Path) -> None:
    texts = {}
    for background in (True, False):
        config = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
        config["callbacks"]["SampleText"]["background"] = background
        path = tmp_path / f"background-{background}.yaml"
        path.write_text(yaml.safe_dump(config))
        run = tmp_path / str(background)
        args = tiny_args(corpus, run, "--trainer.max_steps", "10", "--trainer.val_check_interval", "5")
        args[1] = str(path)
        assert train_main(args) == 0
        texts[background] = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [row["step"] for row in texts[True]] == [5, 10]
    assert texts[True] == texts[False]


def _square(x: int) -> int:
    return x * x


def _fail() -> None:
    raise ValueError("the child's own words")


def test_a_job_returns_its_result_or_raises_what_went_wrong_in_the_child() -> None:
    job = Job(_square, 7)
    assert job.result() == 49 and job.done()
    assert Job(_square, 3, background=False).result() == 9
    with pytest.raises(RuntimeError, match="ValueError: the child's own words"):
        Job(_fail).result()
