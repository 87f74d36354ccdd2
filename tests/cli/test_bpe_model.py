"""A model trained with a learned bpe tokenizer carries it: generate.py, visualize.py and export.py
use it from a checkpoint, a safetensors file and a Hugging Face folder with no extra flag."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from minigpt.checkpoints import load_model
from minigpt.cli.export import export_main
from minigpt.cli.generate import generate_main
from minigpt.cli.train_tokenizer import train_tokenizer_main
from minigpt.cli.visualize import visualize_main
from minigpt.data import BPETokenizer
from minigpt.data.corpus import resolve_corpus
from minigpt.data.split import training_text
from minigpt.model import GPT, GPTConfig

from ..data.helpers import CORPUS, TRICKY


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BPETokenizer]:
    """A tiny model's checkpoint laid out as training writes it, with a bpe learned from CORPUS."""
    bpe = BPETokenizer.learn([CORPUS], vocab_size=300)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=bpe.n_vocab, context_length=16, n_layer=1, n_head=2, n_embd=16))
    path = tmp_path_factory.mktemp("bpe") / "m.ckpt"
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    meta = {"gpt": asdict(model.config), "tokenizer": bpe.spec()}
    torch.save({"state_dict": state, "minigpt": meta, "global_step": 3}, path)
    return path, bpe


def test_generate_and_visualize_use_the_checkpoints_tokenizer(
    checkpoint: tuple[Path, BPETokenizer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, bpe = checkpoint
    prompt = "Now is the winter of 🙂"
    args = ["--checkpoint", str(path), "--prompt", prompt, "--max_new_tokens", "4", "--temperature", "0"]
    assert generate_main(args) == 0
    out = capsys.readouterr().out
    model, _ = load_model(path)
    ids = bpe.encode(prompt)
    for _ in range(4):  # greedy, as generate.py's temperature 0 is
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert out == bpe.decode(ids) + "\n"
    maps = tmp_path / "maps"
    assert visualize_main(["--checkpoint", str(path), "--prompt", "Now is the", "--out", str(maps)]) == 0
    assert any(maps.glob("*.png"))


@pytest.mark.parametrize(("fmt", "name"), [("safetensors", "m.safetensors"), ("huggingface", "hf")])
def test_exported_models_carry_the_tokenizer(
    checkpoint: tuple[Path, BPETokenizer], tmp_path: Path, fmt: str, name: str
) -> None:
    path, bpe = checkpoint
    out = tmp_path / name
    assert export_main(["--checkpoint", str(path), "--out", str(out), "--format", fmt]) == 0
    model, tokenizer = load_model(out)
    assert isinstance(tokenizer, BPETokenizer) and tokenizer.n_vocab == model.config.vocab_size == 300
    assert tokenizer.encode(TRICKY) == bpe.encode(TRICKY)
    assert tokenizer.decode(bpe.encode(TRICKY)) == TRICKY


def test_train_tokenizer_learns_reports_and_saves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "corpus.txt"
    source.write_text(CORPUS, encoding="utf-8")
    saved = tmp_path / "tok.json"
    args = ["--source", str(source), "--vocab_size", "300", "--longest", "3", "--save", str(saved)]
    assert train_tokenizer_main([*args, "--sample", "Now is the winter"]) == 0
    lines = capsys.readouterr().out.splitlines()
    learned = BPETokenizer.learn(training_text(resolve_corpus(str(source)), 0.1), vocab_size=300)
    val = CORPUS[len("".join(training_text(resolve_corpus(str(source)), 0.1))) :]
    assert lines[0].startswith(
        f"bpe: 300 ids, learned from the first {learned.learned_bytes:,} bytes of local file"
    )
    assert lines[1] == (
        f"validation text: {len(val):,} bytes -> {len(learned.encode(val)):,} tokens,"
        f" {len(val) / len(learned.encode(val)):.2f} bytes/token"
    )
    longest = sorted(learned.token_bytes()[1:], key=len, reverse=True)[:3]
    assert lines[2] == "longest tokens: " + ", ".join(repr(t.decode()) for t in longest)
    pieces = [learned.decode([i]) for i in learned.encode("Now is the winter")]
    assert lines[3:5] == [f"sample, 17 bytes in {len(pieces)} tokens:", "|".join(pieces)]
    assert len(pieces) < 17
    assert saved.read_text(encoding="utf-8") == learned.hf_tokenizer_json()
    # Nothing is overwritten without --force, and a bad size is one line.
    assert train_tokenizer_main(args) == 2
    assert train_tokenizer_main(["--source", str(source), "--vocab_size", "100"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"error: {saved} already exists; pass --force to replace it",
        "error: data.vocab_size 100 is too small for bpe: it needs the 256 bytes and 1 special token(s),"
        " at least 257",
    ]
