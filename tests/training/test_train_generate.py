"""End to end, as a user runs it: train.py with the tiny config, then generate.py from its checkpoint."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from minigpt.checkpoints import load_model
from minigpt.cli.generate import generate_main
from minigpt.cli.train import train_main

from .conftest import run_script, tiny_args

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("train")
    result = run_script("train.py", *tiny_args(corpus, work / "run"), cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    return work / "run"


def read_metrics(run: Path) -> list[dict[str, str]]:
    files = sorted(run.glob("csv/version_*/metrics.csv"))
    assert files, f"no metrics.csv under {run}"
    with open(files[-1]) as f:
        return list(csv.DictReader(f))


def test_training_learns_and_writes_checkpoints(trained: Path) -> None:
    assert (trained / "checkpoints" / "last.ckpt").is_file()
    assert (trained / "checkpoints" / "best.ckpt").is_file()
    rows = read_metrics(trained)
    val = [(int(r["step"]), float(r["val_loss"])) for r in rows if r.get("val_loss")]
    assert [step for step, _ in val] == [19, 39]  # val_check_interval 20, max_steps 40
    vocab = load_model(trained)[1].n_vocab
    # Better than uniform guessing over the characters, and better at the end than midway.
    assert val[-1][1] < math.log(vocab) - 1.0
    assert val[-1][1] < val[0][1]
    ppl = [float(r["val_ppl"]) for r in rows if r.get("val_ppl")]
    assert ppl[-1] == pytest.approx(math.exp(val[-1][1]), rel=1e-4)
    assert any(r.get("tokens_per_sec") for r in rows)
    assert any(r.get("lr-AdamW/pg1") for r in rows)


def test_checkpoint_records_model_and_tokenizer_and_loads_safely(trained: Path) -> None:
    checkpoint = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    meta = checkpoint["minigpt"]
    assert meta["tokenizer"]["name"] == "char"
    assert meta["gpt"]["n_layer"] == 2 and meta["gpt"]["vocab_size"] == len(meta["tokenizer"]["chars"])
    assert checkpoint["global_step"] == 40
    assert not any("mask" in key for key in checkpoint["state_dict"])
    model, tokenizer = load_model(trained / "checkpoints" / "last.ckpt")
    assert model.config.vocab_size == tokenizer.n_vocab
    assert not model.training


def test_generate_streams_a_continuation_of_the_prompt(trained: Path) -> None:
    result = run_script(
        "generate.py",
        "--checkpoint",
        str(trained),
        "--prompt",
        "ROMEO:",
        "--max_new_tokens",
        "50",
        cwd=trained,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ROMEO:")
    assert len(result.stdout) == len("ROMEO:") + 50 + 1  # one character per token, then a newline


def generated(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """What generate.py prints for `args`, run in this process (no new interpreter to start)."""
    assert generate_main(list(args)) == 0
    return capsys.readouterr().out


def test_generate_is_reproducible_and_cache_does_not_change_tokens(
    trained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--checkpoint", str(trained), "--prompt", "KING", "--max_new_tokens", "80", "--seed", "7"]
    cached = generated(capsys, *args)
    assert cached == generated(capsys, *args) == generated(capsys, *args, "--no_cache")
    assert cached != generated(capsys, *args[:-1], "8")


def test_generate_several_samples(trained: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = generated(capsys, "--checkpoint", str(trained), "--num_samples", "3", "--max_new_tokens", "10")
    assert [line for line in out.splitlines() if line.startswith("--- sample")] == [
        "--- sample 1 ---",
        "--- sample 2 ---",
        "--- sample 3 ---",
    ]


def test_a_new_run_never_overwrites_an_existing_one(
    trained: Path, corpus: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(trained.parent)
    before = (trained / "checkpoints" / "last.ckpt").read_bytes()
    assert train_main(tiny_args(corpus, trained)) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("error: ")
    assert "already holds a run" in err and "--ckpt_path last" in err
    assert (trained / "checkpoints" / "last.ckpt").read_bytes() == before


def test_resume_continues_from_the_saved_step(trained: Path, corpus: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    result = run_script(
        "train.py", *tiny_args(corpus, run, "--ckpt_path", "last", "--trainer.max_steps", "60"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 60
    # The resumed run started from the saved weights: it wrote a second CSV version whose
    # first logged step follows the saved one.
    rows = read_metrics(run)
    assert min(int(r["step"]) for r in rows) > saved["global_step"]
    assert len(list(run.glob("csv/version_*"))) == 2
