"""generate.py and export.py: typed options, one-line errors, nothing overwritten."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from minigpt.checkpoints import MODEL_KEY, load_model
from minigpt.cli.export import export_main
from minigpt.cli.generate import generate_main
from minigpt.model import GPT

from ..checkpoints.helpers import CONFIG, write_checkpoint
from ..checkpoints.helpers import model as model  # noqa: F401  (the fixture)


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
        (["--max_new_tokens", "-1"], "max_new_tokens must be >= 0"),
        (["--temperature", "-0.5"], "temperature must be >= 0"),
        (["--top_p", "0"], "top_p must be in (0, 1]"),
        (["--top_p", "1.5"], "top_p must be in (0, 1]"),
        (["--top_k", "0"], "top_k must be >= 1"),
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


def test_export_writes_the_checkpoints_weights_and_description(model: GPT, tmp_path: Path) -> None:
    checkpoint = torch.load(write_checkpoint(tmp_path / "m.ckpt", model), weights_only=True)
    weights = {key.removeprefix("model."): value for key, value in checkpoint["state_dict"].items()}
    out = tmp_path / "m.safetensors"
    assert export_main(["--checkpoint", str(tmp_path / "m.ckpt"), "--out", str(out)]) == 0
    with safe_open(out, "pt") as exported:
        metadata = exported.metadata()
        tensors = {key: exported.get_tensor(key) for key in exported.keys()}
    assert json.loads(metadata.pop(MODEL_KEY)) == checkpoint[MODEL_KEY]
    # The head is tied to the token embeddings: stored once, the other name in the metadata.
    assert metadata == {"transformer.wte.weight": "lm_head.weight"}
    tensors["transformer.wte.weight"] = tensors["lm_head.weight"]
    assert tensors.keys() == weights.keys()
    for key, value in weights.items():
        torch.testing.assert_close(tensors[key], value, rtol=0, atol=0, msg=key)  # dtype too


def test_generate_reads_its_options_from_a_config_file(
    model: GPT, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_checkpoint(tmp_path / "m.ckpt", model)
    config = tmp_path / "sample.yaml"
    config.write_text(f"checkpoint: {path}\nprompt: to be\nmax_new_tokens: 4\ntemperature: 0\n")
    assert generate_main(["--config", str(config)]) == 0
    greedy = capsys.readouterr().out
    assert greedy.startswith("to be") and len(greedy) == len("to be") + 4 + 1
    # Options after --config win, as for train.py.
    assert generate_main(["--config", str(config), "--max_new_tokens", "2"]) == 0
    assert capsys.readouterr().out == greedy[: len("to be") + 2] + "\n"


def test_every_generate_option_is_documented_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        generate_main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option, words in [
        ("--checkpoint", "run folder"),
        ("--temperature", "0 is greedy"),
        ("--top_p", "Nucleus sampling"),
        ("--no_cache", "KV cache"),
        ("--num_samples", "Independent samples"),
    ]:
        assert option in text and words in text, option


def test_export_writes_the_modern_recipe_for_transformers_and_never_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """small.yaml's levers leave GPT-2's layout: the folder carries our code, and minigpt reads it
    back; an existing folder is one line without --force and left as it was."""
    torch.manual_seed(0)
    modern = GPT(replace(CONFIG, position_embedding="rope", qk_norm=True, activation="relu2")).eval()
    ckpt = write_checkpoint(tmp_path / "m.ckpt", modern)
    out = tmp_path / "m-hf"
    assert export_main(["--checkpoint", str(ckpt), "--out", str(out), "--format", "huggingface"]) == 0
    printed = capsys.readouterr().out
    assert "minigpt's architecture as custom code (rotary position embeddings" in printed
    assert "'char' as tokenizer.json" in printed
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"]
    again, tokenizer = load_model(out)
    assert again.config == modern.config and tokenizer.decode(tokenizer.encode("to be")) == "to be"
    (out / "notes.txt").write_text("mine")
    assert export_main(["--checkpoint", str(ckpt), "--out", str(out), "--format", "huggingface"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {out} already exists; pass --force to replace it"]
    assert (out / "notes.txt").read_text() == "mine"
    assert (
        export_main(["--checkpoint", str(ckpt), "--out", str(out), "--format", "huggingface", "--force"]) == 0
    )
    assert not (out / "notes.txt").exists()
