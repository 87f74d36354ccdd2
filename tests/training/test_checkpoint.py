"""Loading trained weights: the one loader, safe against untrusted files, with one-line errors."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from minigpt.data import CharTokenizer
from minigpt.model import GPT, GPTConfig
from minigpt.training.checkpoint import CheckpointError, export_safetensors, load_model
from minigpt.training.cli import export_main, generate_main

CHARS = " abcdefghijklmnopqrstuvwxyz"
CONFIG = GPTConfig(vocab_size=len(CHARS), context_length=16, n_layer=1, n_head=2, n_embd=16)


def write_checkpoint(path: Path, model: GPT, **meta_overrides) -> Path:
    """A checkpoint laid out as training writes it."""
    meta = {"gpt": asdict(model.config), "tokenizer": CharTokenizer(CHARS).spec(), **meta_overrides}
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "minigpt": meta, "global_step": 3}, path)
    return path


@pytest.fixture
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG).eval()


def test_round_trip_gives_the_same_model_and_tokenizer(model: GPT, tmp_path: Path) -> None:
    loaded, tokenizer = load_model(write_checkpoint(tmp_path / "m.ckpt", model))
    ids = torch.tensor([tokenizer.encode("to be or not")])
    assert_close(loaded(ids), model(ids))
    assert tokenizer.decode(ids[0].tolist()) == "to be or not"


def test_a_description_without_a_gelu_setting_loads_with_gpt2s_gelu(model: GPT, tmp_path: Path) -> None:
    # Checkpoints written before `gelu_approximate` existed were trained with the tanh GELU.
    old = {k: v for k, v in asdict(model.config).items() if k != "gelu_approximate"}
    loaded, _ = load_model(write_checkpoint(tmp_path / "old.ckpt", model, gpt=old))
    assert loaded.config.gelu_approximate == "tanh"
    fresh, _ = load_model(write_checkpoint(tmp_path / "new.ckpt", model))
    assert fresh.config.gelu_approximate == model.config.gelu_approximate == "none"


def test_safetensors_export_round_trips_with_tied_weights(model: GPT, tmp_path: Path) -> None:
    path = export_safetensors(model, CharTokenizer(CHARS), tmp_path / "m.safetensors")
    loaded, _ = load_model(path)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    ids = torch.tensor([[1, 2, 3, 4]])
    assert_close(loaded(ids), model(ids))


def test_a_run_directory_resolves_to_its_best_checkpoint(model: GPT, tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    write_checkpoint(tmp_path / "checkpoints" / "best.ckpt", model)
    assert load_model(tmp_path)[0].config == CONFIG
    with pytest.raises(CheckpointError, match="no checkpoint in run directory"):
        load_model(tmp_path / "checkpoints")


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_model(tmp_path / "nope.ckpt")


def test_truncated_checkpoint(model: GPT, tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "m.ckpt", model)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or not a PyTorch checkpoint"):
        load_model(path)


def test_a_checkpoint_that_does_not_match_its_description(model: GPT, tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "m.ckpt", model, gpt={**asdict(CONFIG), "n_embd": 32})
    with pytest.raises(CheckpointError, match="does not match its model description"):
        load_model(path)


def test_a_foreign_file_is_not_a_minigpt_checkpoint(tmp_path: Path) -> None:
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.ckpt")
    with pytest.raises(CheckpointError, match="not a minigpt checkpoint"):
        load_model(tmp_path / "other.ckpt")


class Payload:
    """Unpickling this runs code: it would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_malicious_pickle_is_refused_and_never_runs(model: GPT, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = write_checkpoint(tmp_path / "evil.ckpt", model, payload=Payload(marker))
    # The payload really runs when unpickled without restrictions...
    torch.load(path, weights_only=False)
    assert marker.exists()
    marker.unlink()
    # ...and our loader refuses it without running it.
    with pytest.raises(CheckpointError, match="refusing to load"):
        load_model(path)
    assert not marker.exists()


def test_generate_reports_bad_checkpoints_in_one_line(
    model: GPT, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_checkpoint(tmp_path / "m.ckpt", model)
    path.write_bytes(b"not a checkpoint")
    assert generate_main(["--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot read checkpoint")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", ""], "the prompt is empty"),
        (["--max_new_tokens", "-1"], "--max_new_tokens: must be >= 0"),
        (["--temperature", "-0.5"], "--temperature: must be >= 0"),
        (["--top_p", "0"], "--top_p: must be in (0, 1]"),
        (["--top_p", "1.5"], "--top_p: must be in (0, 1]"),
        (["--top_k", "0"], "--top_k: must be >= 1"),
        (["--prompt", "ROMEO!"], "'R' (U+0052)"),
    ],
)
def test_generate_rejects_bad_options_in_one_line(
    model: GPT, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    path = write_checkpoint(tmp_path / "m.ckpt", model)
    assert generate_main(["--checkpoint", str(path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_a_prompt_longer_than_the_context_is_cropped_with_a_warning(
    model: GPT, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_checkpoint(tmp_path / "m.ckpt", model)
    prompt = "to be or not to be that is the question"
    assert generate_main(["--checkpoint", str(path), "--prompt", prompt, "--max_new_tokens", "5"]) == 0
    out, err = capsys.readouterr()
    assert f"the prompt has {len(prompt)} tokens; only its last 16 fit the context" in err
    assert out.startswith(prompt) and len(out) == len(prompt) + 5 + 1


def test_export_never_overwrites_without_force(model: GPT, tmp_path: Path, capsys) -> None:
    ckpt = write_checkpoint(tmp_path / "m.ckpt", model)
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"keep me")
    assert export_main(["--checkpoint", str(ckpt), "--out", str(out)]) == 2
    assert out.read_bytes() == b"keep me"
    assert export_main(["--checkpoint", str(ckpt), "--out", str(out), "--force"]) == 0
    assert load_model(out)[0].config == CONFIG
