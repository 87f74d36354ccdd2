"""GPT-2 in the Hugging Face layout, checked against transformers itself in both directions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch.testing import assert_close

from minigpt.checkpoints import (
    CheckpointError,
    load_model,
    open_model_file,
    read_description,
    save_huggingface,
)
from minigpt.checkpoints.load import load_weights
from minigpt.data import CharTokenizer
from minigpt.model import GPT, GPTConfig
from minigpt.model.generation import generate

from .helpers import HF_CHARS, hf_greedy, randomize

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


# (vocab, positions, layers, heads, width, activation, tied head, LayerNorm epsilon)
HF_SHAPES = [
    (len(HF_CHARS), 24, 2, 4, 32, "gelu_new", True, 1e-5),
    (len(HF_CHARS), 16, 3, 2, 16, "gelu", False, 1e-6),
    (101, 40, 1, 1, 8, "gelu_pytorch_tanh", True, 1e-3),
]


def hf_gpt2(vocab, positions, layers, heads, width, activation, tied, eps):
    """A random transformers GPT-2 (see `randomize`)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=positions,
        n_layer=layers,
        n_head=heads,
        n_embd=width,
        activation_function=activation,
        tie_word_embeddings=tied,
        layer_norm_epsilon=eps,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    randomize(model)
    return model


def save_with_char_tokenizer(theirs, folder: Path) -> Path:
    """`save_pretrained`, and beside it a character vocabulary of the model's size: without a
    tokenizer of some kind a small-vocabulary folder cannot be read (tested below)."""
    theirs.save_pretrained(folder)
    chars = "".join(chr(33 + i) for i in range(theirs.config.vocab_size))
    (folder / "minigpt_tokenizer.json").write_text(json.dumps(CharTokenizer(chars).spec()))
    return folder


def load_gpt(path: Path) -> GPT:
    """Our model from a model folder, the tokenizer left out (it is tested on its own)."""
    model_file = open_model_file(path)
    config, _ = read_description(model_file.description, model_file.path)
    model = GPT(config)
    load_weights(model_file, model)
    return model.eval()


def assert_same_function(ours: GPT, theirs, vocab: int, length: int) -> None:
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (2, length))
    with torch.no_grad():
        assert_close(ours(ids), theirs(ids).logits, rtol=1e-5, atol=1e-5)
        prompt = ids[:, :3]
        n = length - 3
        assert torch.equal(generate(ours, prompt, n, temperature=0.0), hf_greedy(theirs, prompt, n))


@pytest.mark.parametrize("shape", HF_SHAPES, ids=lambda s: f"{s[2]}x{s[3]}x{s[4]}-{s[5]}-tied{s[6]}")
def test_a_transformers_gpt2_loads_computing_the_same_logits_and_generations(shape, tmp_path: Path) -> None:
    theirs = hf_gpt2(*shape)
    ours = load_gpt(save_with_char_tokenizer(theirs, tmp_path))
    assert ours.config.gelu_approximate == ("none" if shape[5] == "gelu" else "tanh")
    assert ours.config.tie_weights is shape[6] and ours.config.layer_norm_eps == shape[7]
    assert_same_function(ours, theirs, shape[0], shape[1])


def test_weights_saved_as_a_pickle_or_without_the_head_prefix_load_too(tmp_path: Path) -> None:
    theirs = hf_gpt2(*HF_SHAPES[0])
    pickled, bare = tmp_path / "pickled", tmp_path / "bare"
    for folder in (pickled, bare):
        save_with_char_tokenizer(theirs, folder)
        (folder / "model.safetensors").unlink()
    torch.save(theirs.state_dict(), pickled / "pytorch_model.bin")
    # A GPT2Model's keys (no `transformer.`), and the mask buffers older versions saved.
    state = {k.removeprefix("transformer."): v.contiguous() for k, v in theirs.state_dict().items()}
    state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    state["h.0.attn.bias"] = torch.ones(1, 1, 24, 24)
    save_file(state, bare / "model.safetensors")
    for folder in (pickled, bare):
        assert_same_function(load_gpt(folder), theirs, HF_SHAPES[0][0], 24)


@pytest.mark.parametrize(
    "config",
    [
        GPTConfig(vocab_size=len(HF_CHARS), context_length=20, n_layer=2, n_head=2, n_embd=16),
        GPTConfig(
            vocab_size=len(HF_CHARS) + 3,  # padded past the tokenizer
            context_length=12,
            n_layer=1,
            n_head=4,
            n_embd=16,
            qkv_bias=True,
            bias=False,  # written as zero biases: the same function
            tie_weights=False,
            gelu_approximate="tanh",
            layer_norm_eps=1e-6,
        ),
    ],
    ids=["ours-default", "no-bias-untied-tanh"],
)
def test_our_export_loads_in_transformers_with_no_custom_code(config: GPTConfig, tmp_path: Path) -> None:
    torch.manual_seed(0)
    ours = GPT(config).eval()
    randomize(ours)
    note = save_huggingface(ours, CharTokenizer(HF_CHARS), tmp_path / "hf")
    assert "GPT-2's layout, no custom code" in note and not list((tmp_path / "hf").glob("*.py"))
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert_same_function(ours, theirs, len(HF_CHARS), config.context_length)
    # And back: minigpt reads the folder, tokenizer included.
    again, tokenizer = load_model(tmp_path / "hf")
    assert tokenizer.spec() == CharTokenizer(HF_CHARS).spec()
    assert_same_function(again, theirs, len(HF_CHARS), config.context_length)


def test_export_replaces_a_folder_only_when_asked(tmp_path: Path) -> None:
    model = GPT(GPTConfig(vocab_size=len(HF_CHARS), context_length=8, n_layer=1, n_head=1, n_embd=8))
    out = tmp_path / "hf"
    save_huggingface(model, CharTokenizer(HF_CHARS), out)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="already exists"):
        save_huggingface(model, CharTokenizer(HF_CHARS), out)
    assert (out / "notes.txt").read_text() == "mine"
    save_huggingface(model, CharTokenizer(HF_CHARS), out, replace=True)
    assert not (out / "notes.txt").exists() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging folder left behind


def _folder(tmp_path: Path, **config_changes) -> Path:
    save_with_char_tokenizer(hf_gpt2(*HF_SHAPES[0]), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | config_changes))
    return tmp_path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "llama"}, "model_type is 'llama'; minigpt reads GPT-2 models only"),
        ({"n_inner": 100}, "n_inner is 100; minigpt's MLP is 4 x n_embd = 128 wide"),
        ({"activation_function": "relu"}, "activation_function is 'relu'"),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx is True"),
        ({"n_head": 5}, "n_embd (32) must be divisible by n_head (5)"),
        ({"n_embd": 64}, "transformer.wte.weight has shape (61, 32), but config.json implies (61, 64)"),
        ({"n_layer": 3}, "lacks transformer.h.2.ln_1.weight"),
        (
            {"n_layer": 1},
            "holds transformer.h.1.attn.c_attn.bias, which GPT-2 with this config.json does not",
        ),
        ({"tie_word_embeddings": False}, "lacks lm_head.weight"),
    ],
)
def test_what_our_model_cannot_compute_is_refused_in_one_line_naming_it(
    tmp_path: Path, changes: dict, message: str
) -> None:
    with pytest.raises(CheckpointError) as caught:
        load_model(_folder(tmp_path, **changes))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_folder_without_weights_or_with_pickled_objects_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(
        CheckpointError, match="has config.json but no model.safetensors or pytorch_model.bin"
    ):
        load_model(folder)
    torch.save({"weights": object()}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="refusing to load .*pytorch_model.bin: it holds objects other"):
        load_model(folder)


def test_a_small_vocabulary_without_tokenizer_files_cannot_be_guessed(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "minigpt_tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="cannot tell which tokenizer it was trained with"):
        load_model(folder)


def test_a_hub_name_without_a_network_is_one_line_saying_to_pass_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty hub cache
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as caught:
        load_model("openai-community/gpt2")
    message = str(caught.value)
    assert message.startswith("checkpoint not found: openai-community/gpt2 is not a local file or folder")
    assert "pass a local folder holding config.json and model.safetensors" in message
    assert "\n" not in message
