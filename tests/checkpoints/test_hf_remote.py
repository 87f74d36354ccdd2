"""Every model of ours in transformers: GPT-2's layout where it suffices, else our code with it.

Random models, one per setting of `GPTConfig` and one per combination the shipped configs use,
are exported and loaded through `AutoModelForCausalLM`: the logits must equal ours and greedy
generation, with and without transformers' cache, must give the same tokens to the end of the
context. Our loader reads the folders back without running their code.
"""

from __future__ import annotations

import ast
import json
import shutil
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
import yaml
from torch.testing import assert_close

from minigpt.checkpoints import CheckpointError, load_model, save_huggingface
from minigpt.checkpoints.hf_remote import model_sources
from minigpt.data import CharTokenizer
from minigpt.model import GPT, GPTConfig
from minigpt.model.generation import generate

from ..training.conftest import REPO
from .helpers import HF_CHARS, hf_greedy, randomize

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

SHAPE = GPTConfig(vocab_size=len(HF_CHARS), context_length=12, n_layer=2, n_head=2, n_embd=16)
"""Small enough to load in a blink, two layers so a mix-up between them shows."""

LEVERS = {
    "rope": dict(position_embedding="rope", rope_base=500.0, qkv_bias=True, dropout=0.5, attention="sdpa"),
    "norms": dict(
        norm="rmsnorm", activation="relu2", tie_weights=False, layer_norm_eps=1e-2, zero_init_proj=True
    ),
    "qk-norm": dict(qk_norm=True, gelu_approximate="tanh", bias=False, attention="explicit"),
}
"""Every setting that is not the shape, at another value than its default, each beside a lever
GPT-2 lacks so the custom code computes it (GPT-2's own settings are checked in its layout by
the shipped GPT-2 recipe and in test_hf.py)."""
SHAPE_SETTINGS = {"vocab_size", "context_length", "n_layer", "n_head", "n_embd"}


def shipped_settings(*names: str) -> dict:
    """`model.gpt` of configs/ files laid one over the other, without the shape."""
    settings: dict = {}
    for name in names:
        settings |= yaml.safe_load((REPO / "configs" / name).read_text())["model"]["gpt"]
    return {key: value for key, value in settings.items() if key not in SHAPE_SETTINGS}


CASES = LEVERS | {
    "small.yaml": shipped_settings("small.yaml"),
    "char.yaml": shipped_settings("char.yaml"),
    "recipes/gpt2.yaml": shipped_settings("small.yaml", "recipes/gpt2.yaml"),
}


def test_every_setting_of_the_model_is_exported_here() -> None:
    """A setting added to GPTConfig must get a case above (and so be exported, or refused)."""
    levers = {name for changes in LEVERS.values() for name in changes}
    assert levers == {field.name for field in fields(GPTConfig)} - SHAPE_SETTINGS


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[GPT, Path]]:
    """Each case's random model, and the folder it was exported to."""
    out = {}
    for i, (name, changes) in enumerate(CASES.items()):
        torch.manual_seed(i)
        model = GPT(replace(SHAPE, **changes)).eval()
        randomize(model)
        folder = tmp_path_factory.mktemp("hf") / f"case{i}"
        save_huggingface(model, CharTokenizer(HF_CHARS), folder)
        out[name] = model, folder
    return out


@pytest.mark.parametrize("case", CASES)
def test_transformers_computes_our_logits_and_greedy_tokens_with_and_without_its_cache(
    case: str, exported: dict[str, tuple[GPT, Path]]
) -> None:
    ours, folder = exported[case]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    torch.manual_seed(1)
    ids = torch.randint(0, len(HF_CHARS), (2, SHAPE.context_length))
    prompt, n = ids[:, :3], SHAPE.context_length - 3
    with torch.no_grad():
        expected_logits = ours(ids)
        assert_close(theirs(ids, use_cache=False).logits, expected_logits, rtol=1e-5, atol=1e-5)
        # The prompt, then one token at a time through transformers' cache: the same logits.
        cache = transformers.DynamicCache()
        steps = [theirs(prompt, cache=cache).logits]
        steps += [theirs(ids[:, i : i + 1], cache=cache).logits for i in range(3, SHAPE.context_length)]
        assert cache.get_seq_length() == SHAPE.context_length
        assert_close(torch.cat(steps, dim=1), expected_logits, rtol=1e-5, atol=1e-5)
        expected = generate(ours, prompt, n, temperature=0.0)
        for use_cache in (True, False):
            assert torch.equal(hf_greedy(theirs, prompt, n, use_cache=use_cache), expected), use_cache
        # And back in minigpt: the same function (GPT-2's layout adds zero biases), the same tokenizer.
        again, tokenizer = load_model(folder)
        assert_close(again(ids), ours(ids), rtol=0, atol=0)
    assert tokenizer.spec() == CharTokenizer(HF_CHARS).spec()
    if "auto_map" in json.loads((folder / "config.json").read_text()):  # our code: the same model
        assert again.config == ours.config


def test_only_gpt2s_own_recipe_is_written_without_custom_code(exported: dict) -> None:
    plain = {
        case
        for case, (_, folder) in exported.items()
        if json.loads((folder / "config.json").read_text())["model_type"] == "gpt2"
    }
    assert plain == {"recipes/gpt2.yaml"}
    assert not list(exported["recipes/gpt2.yaml"][1].glob("*.py"))


def test_the_folders_code_is_our_model_package_as_it_is(exported: dict) -> None:
    folder = exported["small.yaml"][1]
    copied = {path.name: path.read_text() for path in folder.glob("minigpt_*.py")}
    assert copied == model_sources()
    for name, text in copied.items():
        header, _, body = text.partition("\n")
        original = REPO / "model" / name.removeprefix("minigpt_")
        assert header.startswith("# Copied from minigpt's model/")
        assert body.replace("from .minigpt_", "from .") == original.read_text(), name
    assert {"minigpt_gpt.py", "minigpt_attention.py", "minigpt_rotary.py"} <= set(copied)


def test_a_model_module_that_needs_more_than_torch_cannot_be_copied(tmp_path: Path) -> None:
    (tmp_path / "gpt.py").write_text("from .helper import f\n")
    (tmp_path / "helper.py").write_text("import numpy as np\n")
    with pytest.raises(ValueError, match="model/helper.py imports numpy"):
        model_sources(tmp_path)


def test_transformers_runs_the_folders_code_only_when_told_to(exported: dict) -> None:
    with pytest.raises(ValueError, match="contains custom code which must be executed"):
        transformers.AutoModelForCausalLM.from_pretrained(exported["small.yaml"][1])


def test_minigpt_reads_a_folder_without_running_its_code(exported: dict, tmp_path: Path) -> None:
    ours, folder = exported["char.yaml"]
    copy = Path(shutil.copytree(folder, tmp_path / "copy"))
    for path in copy.glob("*.py"):
        path.write_text("raise RuntimeError('the code of the folder ran')\n")
    again, _ = load_model(copy)
    for key, value in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


def sets_trust_remote_code(source: str) -> bool:
    """Whether code passes `trust_remote_code=True` or puts `"trust_remote_code": True` in a dict."""
    for node in ast.walk(ast.parse(source)):
        pairs = []
        if isinstance(node, ast.Call):
            pairs = [(keyword.arg, keyword.value) for keyword in node.keywords]
        elif isinstance(node, ast.Dict):
            pairs = [
                (getattr(key, "value", None), value)
                for key, value in zip(node.keys, node.values, strict=True)
            ]
        if any(
            name == "trust_remote_code" and getattr(value, "value", None) is not False
            for name, value in pairs
        ):
            return True
    return False


def test_minigpt_never_trusts_remote_code_on_the_users_behalf() -> None:
    """Whether a folder from elsewhere may run its code is the user's call, never ours."""
    assert sets_trust_remote_code("AutoModel.from_pretrained(path, trust_remote_code=True)")
    assert sets_trust_remote_code("kwargs = {'trust_remote_code': trust}")
    assert not sets_trust_remote_code("AutoModel.from_pretrained(path, trust_remote_code=False)")
    sources = list(REPO.glob("*.py"))
    for package in ("common", "model", "data", "checkpoints", "training", "viz", "cli"):
        sources += (REPO / package).rglob("*.py")
    assert len(sources) > 30
    assert [path for path in sources if sets_trust_remote_code(path.read_text())] == []


def test_the_model_in_transformers_computes_the_loss_and_refuses_padding_and_unknown_ids(
    exported: dict,
) -> None:
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        exported["small.yaml"][1], trust_remote_code=True
    )
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="pass sequences of one length without padding"):
        theirs(ids, attention_mask=torch.tensor([[0, 1, 1]]))
    with pytest.raises(ValueError, match=f"token id {len(HF_CHARS)} is outside this model's vocabulary"):
        theirs(torch.tensor([[1, len(HF_CHARS)]]))
    out = theirs(ids, attention_mask=torch.ones_like(ids), labels=ids)
    assert out.logits.shape == (1, 3, len(HF_CHARS))
    # The loss is the next-token cross-entropy, as transformers' causal LMs compute it.
    assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits[0, :-1], ids[0, 1:]))


def test_a_folder_transformers_saved_again_reads_back_from_its_tokenizer_json(
    exported: dict, tmp_path: Path
) -> None:
    """`save_pretrained` keeps the model, the code and tokenizer.json, and drops our own spec."""
    ours, folder = exported["char.yaml"]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    theirs.save_pretrained(tmp_path / "again")
    transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True).save_pretrained(
        tmp_path / "again"
    )
    assert not (tmp_path / "again" / "minigpt_tokenizer.json").exists()
    again, tokenizer = load_model(tmp_path / "again")
    assert again.config == ours.config and tokenizer.spec() == CharTokenizer(HF_CHARS).spec()
    for key, value in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key
    # A tokenizer.json minigpt did not write is refused in one line.
    (tmp_path / "again" / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram"}}))
    with pytest.raises(CheckpointError, match="tokenizer.json is not a tokenizer minigpt writes"):
        load_model(tmp_path / "again")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_head": 5}, "n_embd (16) must be divisible by n_head (5)"),
        ({"activation": "swiglu"}, "model activation must be one of gelu, relu2, got 'swiglu'"),
        ({"vocab_size": None}, "config.json has no vocab_size"),
        ({"logit_softcap": 30.0}, "was trained with model.gpt.logit_softcap, which minigpt no longer has"),
        ({"n_layer": 3}, "does not match its model description"),
    ],
)
def test_a_config_our_model_cannot_build_is_refused_in_one_line(
    exported: dict, tmp_path: Path, changes: dict, message: str
) -> None:
    folder = Path(shutil.copytree(exported["small.yaml"][1], tmp_path / "copy"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))
    with pytest.raises(CheckpointError) as caught:
        load_model(folder)
    assert message in str(caught.value) and "\n" not in str(caught.value)
