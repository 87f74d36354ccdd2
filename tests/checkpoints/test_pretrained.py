"""Starting from trained weights: the context may shrink, with or without a position table; a hub
name with no hub to fetch it from is read from the hub's cache, or is one line saying how to get it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from minigpt.checkpoints import CheckpointError, save_huggingface, save_safetensors
from minigpt.checkpoints.pretrained import load_pretrained, open_pretrained, pretrained_config
from minigpt.data import CharTokenizer
from minigpt.model import GPT, GPTConfig

CHARS = " abcdefghijklmnopqrstuvwxyz"


@pytest.mark.parametrize("position_embedding", ["learned", "rope"])
def test_a_shorter_context_keeps_the_weights_and_the_first_positions(
    position_embedding: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=27, context_length=16, n_layer=1, n_head=2, n_embd=8, position_embedding=position_embedding
    )
    trained = GPT(config).eval()
    save_safetensors(trained, CharTokenizer(CHARS), tmp_path / "m.safetensors")
    model_file, weights, _ = open_pretrained(tmp_path / "m.safetensors")
    shorter = pretrained_config(weights, replace(config, context_length=8), {"context_length"}, "m")
    model = GPT(shorter).eval()
    load_pretrained(model, model_file, weights)
    ids = torch.randint(0, 27, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), trained(ids))  # the first 8 positions compute the same


CLOSED = "http://127.0.0.1:9"
"""Nothing listens on the discard port: the hub there is refused at once."""


@pytest.fixture
def unreachable_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The hub at a closed port, an empty hub cache (returned) and the working folder empty."""
    import huggingface_hub.constants

    from minigpt.common import hub

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", CLOSED)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.chdir(tmp_path)
    hub.hub_unreachable.cache_clear()
    yield tmp_path / "hub-cache"
    hub.hub_unreachable.cache_clear()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "gpt2-124m",  # docs/huggingface.md's folder name for GPT-2, not a hub name
            "no folder gpt2-124m here, and it cannot be fetched: the Hugging Face hub "
            f"({CLOSED}) cannot be reached; where a network is, download `gpt2` into it with "
            "`hf download gpt2 --local-dir gpt2-124m`, then copy that folder here",
        ),
        (
            "openai-community/gpt2",
            "no file or folder openai-community/gpt2 here, and the hub model `openai-community/gpt2` "
            f"cannot be fetched: the Hugging Face hub ({CLOSED}) cannot be reached; where a network is, "
            "download it with `hf download openai-community/gpt2 --local-dir gpt2`, then copy that "
            "folder here and pass gpt2",
        ),
    ],
)
def test_hub_weights_without_the_hub_are_one_line_saying_how_to_download_them_within_5_s(
    name: str, expected: str, unreachable_hub: Path
) -> None:
    start = time.perf_counter()
    with pytest.raises(CheckpointError) as caught:
        open_pretrained(name)
    assert time.perf_counter() - start < 5.0
    assert str(caught.value) == expected


def test_hub_weights_in_the_hub_cache_open_without_the_hub(unreachable_hub: Path) -> None:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=27, context_length=16, n_layer=1, n_head=2, n_embd=8)
    revision = "0" * 40
    snapshot = unreachable_hub / "models--minigpt-tests--tiny" / "snapshots" / revision
    save_huggingface(GPT(config), CharTokenizer(CHARS), snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(revision)
    start = time.perf_counter()
    model_file, weights, _ = open_pretrained("minigpt-tests/tiny")
    assert time.perf_counter() - start < 5.0
    assert model_file.path == snapshot and weights.n_embd == 8
