"""Fine-tuning a saved GPT-2 through train.py, and handing the result to transformers."""

from __future__ import annotations

import csv
import json
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from minigpt.checkpoints import load_model
from minigpt.checkpoints.hf_tokenizer import write_gpt2_vocabulary
from minigpt.cli.export import export_main
from minigpt.cli.generate import generate_main
from minigpt.cli.train import train_main
from minigpt.cli.visualize import visualize_main
from minigpt.data import CharTokenizer
from minigpt.data.tokenizer.gpt2 import GPT2Tokenizer
from minigpt.model import GPT
from minigpt.training.precision import resolve_precision

from ..training.conftest import REPO, make_play, run_script

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

pytestmark = pytest.mark.slow

FAULTS = "tests.training.faults"
ENV = {"PYTHONPATH": str(REPO)}


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs made in this process prepare their data under the working directory: keep it in tmp."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "play.txt"
    path.write_text(make_play(800, seed=3))
    return path


def tiny_gpt2(vocab_size: int, folder: Path, std: float = 0.02) -> Path:
    """A random GPT-2 saved by transformers, as a downloaded one would be (context 64), its weights
    drawn with standard deviation `std`."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=4, initializer_range=std
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def char_gpt2_in(folder: Path, text: Path, std: float = 0.02) -> Path:
    """A tiny GPT-2 whose ids are the text's characters (offline: no GPT-2 vocabulary needed)."""
    tokenizer = CharTokenizer.from_texts([text.read_text()])
    tiny_gpt2(tokenizer.n_vocab, folder, std)
    (folder / "minigpt_tokenizer.json").write_text(json.dumps(tokenizer.spec()))
    return folder


@pytest.fixture(scope="module")
def char_gpt2(text: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return char_gpt2_in(tmp_path_factory.mktemp("models") / "char-gpt2", text)


def finetune_args(text: Path, weights: Path, run: Path, *extra: str) -> list[str]:
    return [
        "--config",
        "finetune.yaml",
        "--model.init_from",
        str(weights),
        "--data.config.source",
        str(text),
        "--data.config.batch_size",
        "8",
        "--trainer.default_root_dir",
        str(run),
        "--trainer.max_steps",
        "16",
        "--trainer.val_check_interval",
        "8",
        "--trainer.enable_progress_bar",
        "false",
        # Bit-exact resume is checked on the CPU: a GPU's embedding backward adds with atomics, in any order.
        "--trainer.accelerator",
        "cpu",
        "--model.optim.lr",
        "3e-3",
        "--model.optim.warmup_steps",
        "4",
        *extra,
    ]


def mean_loss(model: GPT, ids: list[int], context: int) -> float:
    windows = torch.tensor(ids[: (len(ids) - 1) // context * context + 1])
    x = windows[:-1].view(-1, context)
    y = windows[1:].view(-1, context)
    with torch.no_grad():
        logits = model(x)
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()))


def test_the_fine_tune_config_takes_its_shape_from_the_weights(
    text: Path, char_gpt2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = finetune_args(text, char_gpt2, tmp_path / "run", "--data.config.tokenizer", "char")
    with pytest.raises(SystemExit) as done:
        train_main([*args, "--print_config"])
    assert done.value.code == 0
    gpt = yaml.safe_load(capsys.readouterr().out)["model"]["gpt"]
    assert (gpt["n_layer"], gpt["n_head"], gpt["n_embd"], gpt["context_length"]) == (2, 4, 32, 64)
    assert (gpt["qkv_bias"], gpt["bias"], gpt["gelu_approximate"], gpt["dropout"]) == (
        True,
        True,
        "tanh",
        0.1,
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model.gpt.n_layer", "4"], "model.gpt.n_layer is 4 but the weights of"),
        (["--model.gpt.context_length", "65"], "context_length 65 is longer than the 64 positions"),
        (
            ["--data.config.tokenizer", "gpt2-compact"],
            "data.config.tokenizer is 'gpt2-compact', but the weights",
        ),
        (["--model.init_from", "no/such-model.ckpt"], "checkpoint not found: no/such-model.ckpt"),
    ],
)
def test_a_fine_tune_refuses_what_the_weights_exclude_in_one_line(
    text: Path,
    char_gpt2: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    args = finetune_args(text, char_gpt2, tmp_path / "run", "--data.config.tokenizer", "char", *extra)
    assert train_main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1], lines[-3:]


def test_a_char_vocabulary_built_from_other_text_is_refused(
    char_gpt2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.txt"
    other.write_text("only lower case letters here\n" * 200)
    args = finetune_args(other, char_gpt2, tmp_path / "run", "--data.config.tokenizer", "char")
    assert train_main(args) == 2
    assert "(a vocabulary built from other text)" in capsys.readouterr().err.strip().splitlines()[-1]


class FirstStep(L.Callback):
    """Saves `<folder>/first_step.pt`: the weights the run holds before its first optimizer step,
    the first batch, the loss training computed on it, and the run's precision."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.record: dict = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == 0:
            state = pl_module.model.state_dict()
            self.record.update(state={k: v.detach().clone() for k, v in state.items()}, batch=batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == 1:  # the first optimizer step is done; the loss is the one it took
            self.record.update(loss=outputs["loss"].detach().clone(), precision=str(trainer.precision))
            self.folder.mkdir(parents=True, exist_ok=True)
            torch.save(self.record, self.folder / "first_step.pt")


@pytest.mark.parametrize("context", [64, 32], ids=["full-context", "shorter-context"])
def test_a_fine_tune_starts_from_the_weights_it_is_given(
    text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, context: int
) -> None:
    """Before its first step the run holds the file's weights, bit for bit (a shorter context keeps
    the first rows of the position table), and its first loss is the file's model's loss on that
    batch, computed here in the run's precision. Dropout is off: its mask would make the two losses
    differ by chance."""
    # Weights at 10x GPT-2's initial scale: at 0.02 any function of them has a loss of about
    # ln(vocabulary), and a run computing another one (GELU's exact form instead of GPT-2's tanh)
    # could still match the reference to the bit.
    char_gpt2 = char_gpt2_in(tmp_path / "sharp-gpt2", text, std=0.2)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    probe = [f"--trainer.callbacks+={__name__}.FirstStep", f"--trainer.callbacks.folder={tmp_path}"]
    # One step and no validation, on the CPU (where the reference loss below is computed).
    one_step = (
        "--trainer.accelerator",
        "cpu",
        "--trainer.max_steps",
        "1",
        "--trainer.limit_val_batches",
        "0",
    )
    args = finetune_args(text, char_gpt2, tmp_path / "run", "--data.config.tokenizer", "char", *one_step)
    args += ["--model.gpt.dropout", "0", "--model.gpt.context_length", str(context), *probe]
    assert train_main(args) == 0
    first = torch.load(tmp_path / "first_step.pt", weights_only=True)

    source, _ = load_model(char_gpt2)
    expected = source.state_dict()
    expected["transformer.wpe.weight"] = expected["transformer.wpe.weight"][:context]
    assert first["state"].keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(first["state"][key], value, rtol=0, atol=0, msg=key)

    # The precision finetune.yaml asks for, as this machine resolves it (bf16 where native, else fp32).
    assert first["precision"] == resolve_precision("bf16-mixed")
    x, y = first["batch"]
    assert x.shape == (8, context)
    bf16 = first["precision"] == "bf16-mixed"
    # With gradients on, as a training step computes it (without, attention takes SDPA's kernel).
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = source(x)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).detach()
    # The same weights, inputs and kernels: the same bits, in bf16 as in fp32.
    torch.testing.assert_close(first["loss"], loss, rtol=0, atol=0)


def test_fine_tuning_lowers_the_loss_resumes_exactly_and_exports_to_transformers(
    text: Path,
    char_gpt2: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The runs that need no process of their own run in this one: a Python importing Lightning
    # costs seconds.
    monkeypatch.setenv("WANDB_MODE", "disabled")
    char = ("--data.config.tokenizer", "char")
    with caplog.at_level("INFO", logger="minigpt"):
        assert train_main(finetune_args(text, char_gpt2, tmp_path / "straight", *char)) == 0
    assert f"starting from the weights of {char_gpt2}" in caplog.text

    # Lower loss on its text than the weights it started from, on the same windows.
    tokenizer = CharTokenizer.from_texts([text.read_text()])
    ids = tokenizer.encode(text.read_text()[-20_000:])
    before, _ = load_model(char_gpt2)
    after, _ = load_model(tmp_path / "straight")
    assert mean_loss(after, ids, 64) < mean_loss(before, ids, 64) - 0.5

    # Killed after the step-8 checkpoint, resumed: the same weights as the straight run, bit for
    # bit (dropout 0.1 draws from the random state on every step).
    crash = [f"--trainer.callbacks+={FAULTS}.SignalAt", "--trainer.callbacks.step=11"]
    crashed = run_script(
        "train.py",
        *finetune_args(text, char_gpt2, tmp_path / "crashed", *char, *crash),
        cwd=tmp_path,
        env=ENV,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    last = tmp_path / "crashed" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 8
    assert train_main(finetune_args(text, char_gpt2, tmp_path / "crashed", *char, "--ckpt_path", "last")) == 0
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "crashed" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    assert _val_losses(tmp_path / "straight")[-1] == _val_losses(tmp_path / "crashed")[-1]

    # export.py hands the fine-tuned model to transformers, which computes the same logits.
    out = tmp_path / "hf"
    assert (
        export_main(
            ["--checkpoint", str(tmp_path / "straight"), "--out", str(out), "--format", "huggingface"]
        )
        == 0
    )
    assert "GPT-2's layout, no custom code" in capsys.readouterr().out
    theirs = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    x = torch.tensor([ids[:64]])
    with torch.no_grad():
        torch.testing.assert_close(after(x), theirs(x).logits, rtol=1e-5, atol=1e-5)

    # generate.py and visualize.py read the exported folder as they read a run.
    assert generate_main(["--checkpoint", str(out), "--prompt", "ROMEO:", "--max_new_tokens", "20"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")
    # visualize.py's --out is a folder, of one PNG per layer: the same maps as the run's weights draw.
    maps = {}
    for name, checkpoint in (("exported", out), ("run", tmp_path / "straight")):
        folder = tmp_path / f"maps-{name}"
        assert (
            visualize_main(["--checkpoint", str(checkpoint), "--prompt", "ROMEO:", "--out", str(folder)]) == 0
        )
        maps[name] = {path.name: path.read_bytes() for path in folder.iterdir()}
    assert sorted(maps["exported"]) == sorted(maps["run"]) == ["layer0.png", "layer1.png"]
    assert [name for name in maps["run"] if maps["exported"][name] != maps["run"][name]] == []


def _val_losses(run: Path) -> list[float]:
    rows = []
    for path in sorted(run.glob("csv/version_*/metrics.csv")):
        with path.open() as f:
            rows += [float(r["val_loss"]) for r in csv.DictReader(f) if r.get("val_loss")]
    return rows


@pytest.mark.gpt2_ranks
def test_gpt2_vocabulary_from_folder_to_transformers_tokenizer(text: Path, tmp_path: Path) -> None:
    """GPT-2's own vocabulary: a folder's vocab.json makes our tokenizer, and export writes it
    back so that transformers' tokenizer gives the same ids as ours."""
    gpt2 = GPT2Tokenizer()  # GPT-2's ranks: cached, or fetched from the package index
    folder = tiny_gpt2(gpt2.n_vocab, tmp_path / "gpt2-tiny")
    write_gpt2_vocabulary(gpt2.token_bytes(), folder)
    model, tokenizer = load_model(folder)
    assert tokenizer.spec() == gpt2.spec()

    out = tmp_path / "hf"
    assert export_main(["--checkpoint", str(folder), "--out", str(out), "--format", "huggingface"]) == 0
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    sentence = text.read_text()[:5000] + " naïve café — 日本 🙂 <|endoftext|> is text to both"
    assert theirs.encode(sentence) == gpt2.encode(sentence)
    assert theirs.eos_token_id == gpt2.eot_id == json.loads((out / "config.json").read_text())["eos_token_id"]
    assert (out / "vocab.json").read_bytes() == (folder / "vocab.json").read_bytes()
