"""Settings too big for the machine: one mask for all layers, and a one-line refusal of the impossible."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minigpt.cli.generate import generate_main
from minigpt.model import GPT, ConfigError, GPTConfig, MultiHeadAttention, device

from ..checkpoints.helpers import write_checkpoint

CONFIG = GPTConfig(vocab_size=27, context_length=64, n_layer=6, n_head=2, n_embd=16)


@pytest.fixture
def memory_of(monkeypatch: pytest.MonkeyPatch):
    """Make the machine's memory look like `num_bytes`, whatever it is."""

    def set_memory(num_bytes: int) -> None:
        monkeypatch.setattr(device, "device_memory", lambda _: num_bytes)

    return set_memory


def test_every_layer_shares_one_mask_wherever_the_model_goes() -> None:
    model = GPT(CONFIG)
    masks = {block.attn.mask.data_ptr() for block in model.transformer.h}
    assert len(masks) == 1  # a 12-layer model at context 8,192: 64 MB of mask, not 800 MB
    model.to(torch.float64)  # converts every buffer module by module: the masks must stay shared
    model.to("meta")
    masks = [block.attn.mask for block in model.transformer.h]
    assert all(m.device.type == "meta" and m.dtype == torch.bool for m in masks)
    assert len({id(m) for m in masks}) == 1
    # A mask is still the seed's registered, non-persistent buffer, correct after a move.
    back = GPT(CONFIG).to(torch.float64).transformer.h[3].attn
    assert dict(back.named_buffers())["mask"] is back.mask
    assert torch.equal(back.mask, torch.ones(64, 64, dtype=torch.bool).triu(1))
    assert "mask" not in back.state_dict()


def test_a_mask_larger_than_any_machine_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"^model context_length 100000000: its 100000000 x 100000000"):
        MultiHeadAttention(8, 8, 10**8, 0.0, num_heads=2)


def test_a_context_too_long_for_this_machine_is_one_line(memory_of) -> None:
    memory_of(10**9)
    with pytest.raises(ConfigError) as info:
        GPT(GPTConfig(vocab_size=27, context_length=200_000, n_layer=2, n_head=2, n_embd=16))
    message = str(info.value)
    assert message.startswith("model context_length 200000: its 200000 x 200000 attention mask needs 40.0 GB")
    assert message.endswith("more than this machine's cpu memory (1.0 GB)") and "\n" not in message


def test_a_network_too_large_for_this_machine_names_its_shape(memory_of) -> None:
    memory_of(10**4)  # a fifth of its 20k fp32 parameters
    with pytest.raises(ConfigError, match=r"^model n_layer 6, n_embd 16, vocab_size 27, context_length 64: "):
        GPT(CONFIG)


def test_attention_scores_too_large_for_this_machine_are_refused(memory_of) -> None:
    model = GPT(CONFIG).eval()
    ids = torch.zeros(4, 64, dtype=torch.long)
    memory_of(4 * 2 * 64 * 64 * 4 - 1)  # one byte short of one layer's fp32 attention weights
    with pytest.raises(
        ConfigError, match=r"^model context_length 64 at batch size 4: attention over 64 x 64"
    ):
        model(ids)
    memory_of(4 * 2 * 64 * 64 * 4)
    assert model(ids).shape == (4, 64, 27)


def test_generate_refuses_a_model_too_big_for_this_machine_in_one_line(
    memory_of, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = GPTConfig(vocab_size=27, context_length=4096, n_layer=1, n_head=2, n_embd=16)
    path = write_checkpoint(tmp_path / "long.ckpt", GPT(config))
    memory_of(10**6)
    assert generate_main(["--checkpoint", str(path), "--max_new_tokens", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: model context_length 4096: its 4096 x 4096 attention mask needs 16.8 MB, "
        "more than this machine's cpu memory (1.0 MB)"
    ]
