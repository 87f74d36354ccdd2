"""Loading trained models: the one loader, safe against untrusted files, with one-line errors."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from minigpt.checkpoints import CheckpointError, load_model, save_safetensors
from minigpt.data import CharTokenizer
from minigpt.model import GPT, GPTConfig

from .helpers import CHARS, CONFIG, write_checkpoint
from .helpers import model as model  # noqa: F401  (the fixture)


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


REMOVED_OFF = {"logit_softcap": None, "value_residual": False, "unet_skips": False, "embed_norm": False}
"""Settings of levers the ablation rejected, which descriptions written before their removal hold, off."""


def test_a_description_holding_the_removed_levers_off_loads_as_the_same_model(
    model: GPT, tmp_path: Path
) -> None:
    old = asdict(model.config) | REMOVED_OFF
    loaded, _ = load_model(write_checkpoint(tmp_path / "old.ckpt", model, gpt=old))
    assert loaded.config == model.config
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(loaded(ids), model(ids))


@pytest.mark.parametrize(("name", "value"), [("logit_softcap", 30.0), ("value_residual", True)])
def test_a_model_trained_with_a_removed_lever_names_the_commit_that_reads_it(
    model: GPT, tmp_path: Path, name: str, value: object
) -> None:
    trained = asdict(model.config) | REMOVED_OFF | {name: value}
    path = write_checkpoint(tmp_path / "lever.ckpt", model, gpt=trained)
    with pytest.raises(CheckpointError) as caught:
        load_model(path)
    assert str(caught.value) == (
        f"checkpoint {path} was trained with model.gpt.{name}, which minigpt no longer has (its ablation in "
        "benchmarks/RESULTS.md rejected it); commit 6352ba0fea246c09b6ce67c64ad8cdec996f7db4 still reads it"
    )


def test_safetensors_export_round_trips_with_tied_weights(model: GPT, tmp_path: Path) -> None:
    path = save_safetensors(model, CharTokenizer(CHARS), tmp_path / "m.safetensors")
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


def test_a_description_older_than_every_optional_setting_reads_as_what_was_built() -> None:
    from minigpt.checkpoints.description import with_legacy_settings

    # The fields descriptions had before gelu_approximate and the later options existed.
    first = ("vocab_size", "context_length", "n_layer", "n_head", "n_embd", "dropout", "qkv_bias", "bias")
    built = asdict(GPTConfig(vocab_size=27, gelu_approximate="tanh"))
    old = {k: v for k, v in built.items() if k in (*first, "tie_weights", "attention")}
    assert with_legacy_settings(old) == built
