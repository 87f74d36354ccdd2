"""Supervised fine-tuning through train.py: configs/sft.yaml on a tiny model of ours and a small
JSONL of instruction and chat rows, packed several to a window. The run grows the embedding by the
chat markers, its loss and validation count the assistant's tokens only, and it resumes bit for
bit."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minigpt.checkpoints import load_model
from minigpt.checkpoints.load import save_safetensors
from minigpt.cli.train import train_main
from minigpt.data import ChatDataModule
from minigpt.data.chat.conversations import IGNORE_INDEX, ChatDataConfig
from minigpt.model import GPT, GPTConfig

from .helpers import BASE, assert_identical, last_checkpoint, sft_args, step_losses

pytestmark = pytest.mark.slow  # each test trains through train.py, seconds each


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random GPT of ours (char ids, context 64) and 40 conversations: Alpaca rows and chats."""
    folder = tmp_path_factory.mktemp("sft")
    torch.manual_seed(0)
    save_safetensors(
        GPT(GPTConfig(vocab_size=BASE.n_vocab, context_length=64, n_layer=2, n_head=2, n_embd=32)),
        BASE,
        folder / "base.safetensors",
    )
    rng = random.Random(0)
    rows = []
    for _ in range(30):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        rows.append({"instruction": f"Add {a} and {b}.", "input": "", "output": f"{a + b}."})
    for word in ["hi", "yes", "no", "ok", "bye", "up", "on", "go", "so", "me"]:
        messages = [{"role": "system", "content": "Echo."}, {"role": "user", "content": word}]
        rows.append({"messages": [*messages, {"role": "assistant", "content": word.upper()}]})
    (folder / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder / "base.safetensors", folder / "chats.jsonl"


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    return tmp_path


@pytest.fixture(scope="module")
def straight(files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six steps straight through, validated after the third and the sixth."""
    folder = tmp_path_factory.mktemp("straight")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setenv("WANDB_MODE", "disabled")
        assert train_main(sft_args(files, folder / "run")) == 0
    return folder / "run"


def test_the_markers_get_rows_and_the_weights_train(files: tuple[Path, Path], straight: Path) -> None:
    model, tokenizer = load_model(straight / "checkpoints" / "last.ckpt")
    assert tokenizer.n_vocab == model.config.vocab_size == BASE.n_vocab + 4
    assert tokenizer.decode([BASE.n_vocab]) == "<|system|>"
    base, _ = load_model(files[0])
    # Every trained row moved, and the markers' rows too, from where they started (the mean).
    trained = model.transformer.wte.weight
    assert not torch.equal(trained[: BASE.n_vocab], base.transformer.wte.weight)
    assert not torch.equal(trained[BASE.n_vocab], base.transformer.wte.weight.mean(0))
    assert sorted(step_losses(straight)) == list(range(6))


def test_validation_scores_the_answers_of_the_held_out_conversations_only(
    files: tuple[Path, Path], straight: Path
) -> None:
    """The last validation's loss is the mean cross-entropy over the assistant's tokens of the
    held-out conversations, computed here by hand from the last weights, one conversation per
    window: the run scored them packed, which changes nothing but the rounding."""
    model, tokenizer = load_model(straight / "checkpoints" / "last.ckpt")
    config = ChatDataConfig(str(files[1]), split="train", val_fraction=0.1, batch_size=4, pack=False)
    data = ChatDataModule(config, 64)
    data.use_tokenizer(BASE.spec())
    data.setup()
    assert len(data.examples("val")) == 4 and len(data.examples("train")) == 36
    x, y = map(torch.stack, zip(*data._windows("val"), strict=True))
    with torch.no_grad():
        logits = model(x)
    answers = y != IGNORE_INDEX
    expected = F.cross_entropy(logits[answers], y[answers]).item()
    held_out = data.examples("val")
    assert answers.sum() == sum(int(held_out.conversation(i)[1][1:].sum()) for i in range(len(held_out)))
    # Every held-out conversation is a question and its answer: most targets are not the answer's.
    assert answers.sum() < (x != tokenizer.end_id).sum() / 2
    val_losses = [row for row in _metrics(straight) if row.get("val_loss")]
    assert float(val_losses[-1]["val_loss"]) == pytest.approx(expected, rel=1e-5)


def test_a_fine_tune_that_finished_trains_on_bit_exactly(
    files: tuple[Path, Path], in_tmp: Path, straight: Path
) -> None:
    finished = in_tmp / "finished"
    assert train_main(sft_args(files, finished, "--trainer.max_steps", "4")) == 0
    assert last_checkpoint(finished)["global_step"] == 4
    assert train_main(sft_args(files, finished, "--ckpt_path", "last")) == 0
    assert step_losses(finished) == step_losses(straight)
    a, b = last_checkpoint(finished), last_checkpoint(straight)
    assert a["global_step"] == b["global_step"] == 6
    for key in ("state_dict", "optimizer_states", "torch_rng_state"):
        assert_identical(a[key], b[key], key)


def test_chat_data_without_weights_to_fine_tune_is_refused_in_one_line(
    files: tuple[Path, Path], in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = sft_args(files, in_tmp / "run", "--model.init_from", "null")
    assert train_main(args) == 2
    assert "chat data fine-tunes trained weights" in capsys.readouterr().err


def _metrics(run: Path) -> list[dict[str, str]]:
    (path,) = run.glob("csv/version_0/metrics.csv")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
