"""README's headline run, `train.py --config small.yaml`, at a size the suite can afford.

Everything small.yaml sets is kept (bf16-mixed, or fp32 where the CPU has no bf16; its loggers,
callbacks and checkpoints; a byte-level BPE learned from the corpus) except the model's, the
vocabulary's and the run's size. It runs offline.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest
import torch

from minigpt.checkpoints import load_model
from minigpt.cli.generate import generate_main
from minigpt.cli.train import train_main
from minigpt.data import tokenizer_from_spec
from minigpt.model import generate_tokens, optimize_for_decoding
from minigpt.training import precision
from minigpt.training.config import SampleConfig

from ..cli.helpers import parse
from .conftest import run_script
from .helpers import RecordMatmulDtypes, read_metrics

pytestmark = pytest.mark.slow

TINY_SIZE = [
    *("--model.gpt.n_layer", "2", "--model.gpt.n_head", "2", "--model.gpt.n_embd", "64"),
    *("--model.gpt.context_length", "64", "--data.config.batch_size", "8"),
    *("--trainer.max_steps", "6", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "2"),
]


def small_args(corpus: Path, run: Path, *extra: str) -> list[str]:
    """small.yaml on the test corpus and the CPU, tiny-sized, writing into `run`."""
    return [
        *("--config", "small.yaml", "--data.config.source", str(corpus)),
        *("--trainer.default_root_dir", str(run), "--trainer.accelerator", "cpu"),
        *("--trainer.enable_progress_bar", "false", *TINY_SIZE, *extra),
    ]


def native_precision() -> str:
    """What small.yaml's bf16-mixed should become here: bf16 where the hardware has it, else fp32."""
    return "bf16-mixed" if torch.cuda.is_available() or precision.has_native_bf16("cpu") else "32-true"


def announced_precision(console: str) -> str:
    """The precision a run in another process chose by its own measurement of this CPU: bf16-mixed
    as small.yaml asks, unless it said why not (a measurement taken here could read otherwise)."""
    fell_back = re.search(
        r"(?:at ([0-9.]+)x fp32's speed|has no native bf16|MINIGPT_CPU_BF16=0); training in fp32", console
    )
    if fell_back is None:
        return "bf16-mixed"
    if fell_back.group(1) is not None:
        assert float(fell_back.group(1)) < precision.BF16_GAIN, fell_back.group(0)
    return "32-true"


def check_run(run: Path, console: str, tokenizer: str) -> None:
    """What every headline run leaves: the precision it announced, checkpoints, metrics, samples."""
    assert f"{tokenizer} tokens" in console
    expected = native_precision() if not precision._onednn_bf16() else announced_precision(console)
    assert f"; {expected} on cpu" in console
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 6 and checkpoint["minigpt"]["tokenizer"]["name"] == tokenizer
    assert (run / "checkpoints" / "best.ckpt").is_file()
    val = [float(r["val_loss"]) for r in read_metrics(run) if r.get("val_loss")]
    assert len(val) == 2 and all(math.isfinite(v) for v in val)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [3, 6] and all(s["text"].startswith("ROMEO:\n") for s in samples)
    assert (run / "report.html").is_file()


@pytest.mark.parametrize("has_bf16", [True, False])
def test_small_yaml_trains_in_bf16_where_the_cpu_has_it_and_in_fp32_where_not(
    has_bf16: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "_cpu_has_bf16", lambda: has_bf16)
    with caplog.at_level(logging.WARNING, logger="minigpt"):
        cli = parse("--config", "small.yaml", "--trainer.accelerator", "cpu")
    assert cli.trainer.precision == ("bf16-mixed" if has_bf16 else "32-true")
    warned = "training in fp32 instead of bf16-mixed" in caplog.text
    assert warned is not has_bf16


def test_the_headline_run_offline_with_char_tokens(
    corpus: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")  # wandb offline runs in a subprocess below
    run = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="minigpt"):
        args = small_args(corpus, run, "--data.config.tokenizer", "char", "--trainer.log_every_n_steps", "1")
        assert train_main(args) == 0
    check_run(run, caplog.text, "char")
    # Each learning rate under its parameter group's name, Muon's and AdamW's (not pg1, pg2, pg3).
    lr_columns = {name for row in read_metrics(run) for name in row if name.startswith("lr-") and row[name]}
    assert lr_columns == {f"lr-MuonWithAdamW/{group}" for group in ("muon", "decay", "no_decay")}
    capsys.readouterr()
    assert generate_main(["--checkpoint", str(run), "--prompt", "ROMEO:", "--max_new_tokens", "30"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ROMEO:") and len(out) == len("ROMEO:") + 30 + 1


def test_the_headline_run_as_shipped_with_learned_bpe_tokens(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    # 384 ids: this text supports 443 (the plays take 4,096).
    train_args = small_args(corpus, run, "--data.config.vocab_size", "384")
    result = run_script("train.py", *train_args, cwd=tmp_path, env={"WANDB_MODE": "offline"})
    assert result.returncode == 0, result.stderr[-3000:]
    check_run(run, result.stdout + result.stderr, "bpe")
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1

    # generate.py streams BPE tokens as text, holding back the bytes of unfinished characters: what
    # it prints is the generated tokens decoded at once.
    args = ["--checkpoint", str(run), "--prompt", "ROMEO:", "--max_new_tokens", "40", "--seed", "3"]
    streamed = run_script("generate.py", *args, cwd=tmp_path)
    assert streamed.returncode == 0, streamed.stderr[-2000:]
    model, tokenizer = load_model(run)
    optimize_for_decoding(model)  # as generate.py does on CPU: the same kernels, the same numbers
    sample = SampleConfig(prompt="ROMEO:", max_new_tokens=40, top_k=None, seed=3)
    tokens = generate_tokens(
        model,
        torch.tensor([tokenizer.encode(sample.prompt)]),
        sample.max_new_tokens,
        **sample.sampling(),
        generator=torch.Generator().manual_seed(sample.seed),
    )
    ids = [token.item() for token in tokens]
    ids = ids[: ids.index(tokenizer.eot_id)] if tokenizer.eot_id in ids else ids
    assert len(ids) > 5
    # (Read in text mode, the child's "\r" arrives as "\n", as any line ending does.)
    expected = "ROMEO:" + tokenizer.decode(ids) + "\n"
    assert streamed.stdout == expected.replace("\r\n", "\n").replace("\r", "\n")
    # The cache changes how, not what: the same greedy tokens without it. (Sampled tokens could
    # differ where the last bits of a probability decide; a barely trained model has many ties.)
    greedy = [*args, "--top_k", "1"]
    assert generate_main(greedy) == 0
    cached = capsys.readouterr().out
    assert generate_main([*greedy, "--no_cache"]) == 0
    assert capsys.readouterr().out == cached

    # A model whose every next token is end-of-text: generation stops there and prints none of it.
    checkpoint = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)
    eot = tokenizer_from_spec(checkpoint["minigpt"]["tokenizer"]).eot_id
    always_eot = {**checkpoint, "state_dict": ends_every_text(checkpoint["state_dict"], eot)}
    torch.save(always_eot, tmp_path / "eot.ckpt")
    assert generate_main(["--checkpoint", str(tmp_path / "eot.ckpt"), *args[2:]]) == 0
    assert capsys.readouterr().out == "ROMEO:\n"


def ends_every_text(state: dict[str, torch.Tensor], eot: int) -> dict[str, torch.Tensor]:
    """Weights whose logits peak at `eot` after any input: the final LayerNorm outputs the (tied,
    enlarged) end-of-text embedding itself, whose dot product with itself beats every other row's."""
    state = dict(state)
    wte = state["model.transformer.wte.weight"].clone()
    wte[eot] *= 100
    state["model.transformer.wte.weight"] = state["model.lm_head.weight"] = wte
    state["model.transformer.ln_f.weight"] = torch.zeros_like(state["model.transformer.ln_f.weight"])
    state["model.transformer.ln_f.bias"] = wte[eot].clone()
    return state


@pytest.mark.parametrize("native_bf16", [True, False])
def test_small_yaml_multiplies_in_bf16_only_where_the_cpu_has_it(
    native_bf16: bool,
    corpus: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The class of slowdown where a CPU without native bf16 emulates bf16 products (10-50x slower
    than fp32): no matrix product of the run, model or Muon, is bf16 where the CPU lacks it. On
    such a CPU the False case is this machine as it is; on one with bf16 it is that decision."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "_cpu_has_bf16", lambda: native_bf16)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    args = small_args(corpus, tmp_path / "run", "--data.config.tokenizer", "char", "--trainer.max_steps", "3")
    with caplog.at_level(logging.INFO, logger="minigpt"), RecordMatmulDtypes() as record:
        assert train_main(args) == 0
    if native_bf16:
        assert torch.bfloat16 in record.dtypes
        assert "bf16-mixed on cpu" in caplog.text and "Muon orthogonalises in bfloat16" in caplog.text
    else:
        assert record.dtypes == {torch.float32}
        assert "32-true on cpu" in caplog.text and "Muon orthogonalises in float32" in caplog.text
    assert "(5 Newton-Schulz steps, jordan polynomials)" in caplog.text  # small.yaml's Muon
