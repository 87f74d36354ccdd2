"""LoRA through train.py: configs/lora.yaml on test_sft.py's tiny model and conversations. Only
the adapters and the chat markers' rows train, the run resumes bit for bit, it reads and exports
as the merged model, its adapters are written alone, its summary counts what trains, and a bad
setting is one line."""

from __future__ import annotations

import copy
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from minigpt.checkpoints import MODEL_KEY, load_model, read_description, resolve_checkpoint
from minigpt.checkpoints.convert import LORA_KEY, from_lightning, merge_lora
from minigpt.checkpoints.load import save_safetensors
from minigpt.cli.export import export_main
from minigpt.cli.train import train_main
from minigpt.model import GPT, GPTConfig, MultiHeadAttention
from minigpt.model.config import parameter_count
from minigpt.model.vocab import add_token_rows
from minigpt.training.config import LoRAConfig, OptimConfig
from minigpt.training.lora import (
    ADAPTER_FOLDER,
    ADAPTER_WEIGHTS,
    add_adapters,
    is_adapter,
    is_token_rows,
    load_adapter,
    save_adapter,
)
from minigpt.training.loss import next_token_loss
from minigpt.training.optim import build_optimizer

from . import test_sft
from .helpers import BASE, assert_identical, last_checkpoint, sft_args, step_losses

files = test_sft.files
"""test_sft.py's fixture: its tiny GPT of ours and its conversations."""

TINY = GPTConfig(vocab_size=50, context_length=16, n_layer=2, n_head=2, n_embd=32)
ADAPTERS = 2 * 2 * 2
"""Adapter tensors of test_sft.py's model under lora.yaml: 2 blocks x (query, value) x (A, B)."""
MARKERS = list(range(BASE.n_vocab, BASE.n_vocab + 4))
"""The chat markers' ids, new to test_sft.py's weights (which tie the head to the embedding)."""


def lora_args(files: tuple[Path, Path], run: Path, *extra: str) -> list[str]:
    """test_sft.py's run of sft.yaml, with lora.yaml instead."""
    args = sft_args(files, run, *extra)
    assert args[:2] == ["--config", "sft.yaml"]
    return ["--config", "lora.yaml", *args[2:]]


class Said(logging.Handler):
    """The lines the run logs (RunSummary's among them)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += record.getMessage().splitlines()


@pytest.fixture(scope="module")
def straight(files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Six steps straight through, validated after the third and the sixth; and what it logged."""
    folder = tmp_path_factory.mktemp("straight")
    logger, said = logging.getLogger("minigpt"), Said()
    level = logger.level
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(folder)
            patch.setenv("WANDB_MODE", "disabled")
            assert train_main(lora_args(files, folder / "run")) == 0
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
    return folder / "run", said.lines


def starting_model(files: tuple[Path, Path]) -> GPT:
    """The network the run starts from: the weights, with the chat markers' rows (the mean)."""
    model, _ = load_model(files[0])
    add_token_rows(model, BASE.n_vocab + 4, trained=BASE.n_vocab)
    return model


def test_only_the_adapters_and_the_markers_rows_train(
    files: tuple[Path, Path], straight: tuple[Path, list[str]]
) -> None:
    checkpoint = last_checkpoint(straight[0])
    state = from_lightning(checkpoint["state_dict"])
    start = starting_model(files).state_dict()
    adapters = {key: value for key, value in state.items() if is_adapter(key)}
    assert len(adapters) == ADAPTERS
    for key, value in state.items():
        if not is_adapter(key) and not is_token_rows(key):  # the frozen weights, under peft's wrappers
            assert torch.equal(
                value, start[key.replace(".token_adapter", "").replace(".base_layer.", ".")]
            ), key
    # B starts at zero: every one has moved, so the adapters were in the training step's forward.
    assert all(value.abs().sum() > 0 for key, value in adapters.items() if ".lora_B." in key)
    (optimizer,) = checkpoint["optimizer_states"]
    assert sum(len(group["params"]) for group in optimizer["param_groups"]) == ADAPTERS + 1  # tied: one
    assert len(optimizer["state"]) == ADAPTERS + 1

    # The model the run trained: every row but the markers' as the weights had it, bit for bit; the
    # markers', which started alike (the mean of the others), each moved, and apart.
    trained, _ = load_model(straight[0] / "checkpoints" / "last.ckpt")
    table, before = trained.transformer.wte.weight, start["transformer.wte.weight"]
    assert torch.equal(table[: BASE.n_vocab], before[: BASE.n_vocab])
    assert torch.equal(before[MARKERS], before[MARKERS[:1]].expand(4, -1))
    assert all(not torch.equal(table[i], before[i]) for i in MARKERS)
    assert len({tuple(table[i].tolist()) for i in MARKERS}) == 4
    assert trained.lm_head.weight is table  # the head is the embedding still


def test_the_summary_says_how_many_parameters_train(straight: tuple[Path, list[str]]) -> None:
    run, lines = straight
    checkpoint = last_checkpoint(run)
    config, _ = read_description(checkpoint[MODEL_KEY], run)
    trained = sum(v.numel() for k, v in from_lightning(checkpoint["state_dict"]).items() if is_adapter(k))
    assert trained == 2 * 2 * 8 * (32 + 32)  # blocks x (query, value) x rank x (in + out)
    rows = 4 * 32  # the markers' rows, once: the head is tied to the embedding
    total = parameter_count(config) + trained + rows
    assert (
        f"training: {trained:,} + {rows} of {total:,} parameters ({(trained + rows) / total:.2%}), "
        "LoRA of rank 8 on W_query, W_value, and the rows of the 4 tokens new to the weights; the rest frozen"
    ) in lines
    assert f"adapters {run / ADAPTER_FOLDER}" in lines[-1]


def test_the_run_reads_and_exports_as_its_merged_model(
    files: tuple[Path, Path], straight: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """The run folder, its export and its adapters on the starting weights all compute what peft's
    adapted network of the run's checkpoint computes."""
    run = straight[0]
    path = resolve_checkpoint(run)
    checkpoint = torch.load(path, weights_only=True)
    config, _ = read_description(checkpoint[MODEL_KEY], path)
    settings = dict(checkpoint[LORA_KEY])
    assert settings.pop("tokens") == MARKERS
    adapted = GPT(config)
    add_adapters(adapted, LoRAConfig(**{**settings, "targets": tuple(settings["targets"])}), MARKERS)
    adapted.load_state_dict(from_lightning(checkpoint["state_dict"]))
    x = torch.randint(0, config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    x[:, :4] = torch.tensor(MARKERS)  # read the markers' rows; every logit writes them
    with torch.no_grad():
        expected = adapted.eval()(x)

        merged, _ = load_model(run)
        layers = [m.W_query for m in merged.modules() if isinstance(m, MultiHeadAttention)]
        assert layers and all(type(layer) is nn.Linear for layer in layers)
        torch.testing.assert_close(merged(x), expected)

        out = tmp_path / "merged.safetensors"
        assert export_main(["--checkpoint", str(run), "--out", str(out)]) == 0
        with safe_open(out, framework="pt") as f:
            assert not [key for key in f.keys() if "lora" in key or "adapter" in key or "base_layer" in key]
        torch.testing.assert_close(load_model(out)[0](x), expected)

        with safe_open(run / ADAPTER_FOLDER / ADAPTER_WEIGHTS, framework="pt") as f:
            assert [key for key in f.keys() if not is_adapter(key)] == [
                "transformer.wte.token_adapter.trainable_tokens_delta"  # the markers' rows, once
            ]
        alone = starting_model(files)
        load_adapter(alone, run / ADAPTER_FOLDER)
        torch.testing.assert_close(alone.eval()(x), expected)


def test_a_lora_run_that_finished_trains_on_bit_exactly(
    files: tuple[Path, Path],
    straight: tuple[Path, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    finished = tmp_path / "finished"
    assert train_main(lora_args(files, finished, "--trainer.max_steps", "4")) == 0
    assert last_checkpoint(finished)["global_step"] == 4
    assert train_main(lora_args(files, finished, "--ckpt_path", "last")) == 0
    assert step_losses(finished) == step_losses(straight[0])
    a, b = last_checkpoint(finished), last_checkpoint(straight[0])
    assert a["global_step"] == b["global_step"] == 6
    for key in ("state_dict", "optimizer_states", "torch_rng_state"):
        assert_identical(a[key], b[key], key)


def test_a_lora_run_from_a_padded_table_resumes_training_the_markers_rows(
    files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table with rows to spare past its tokenizer's (GPT-2's 50,304) keeps its size when the
    markers come, so the resumed run learns from the weights it started from that they are new."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    torch.manual_seed(0)
    padded = tmp_path / "padded.safetensors"
    shape = GPTConfig(vocab_size=BASE.n_vocab + 12, context_length=64, n_layer=2, n_head=2, n_embd=32)
    save_safetensors(GPT(shape), BASE, padded)
    run, weights = tmp_path / "run", (padded, files[1])
    assert train_main(lora_args(weights, run, "--trainer.max_steps", "2")) == 0
    assert train_main(lora_args(weights, run, "--trainer.max_steps", "3", "--ckpt_path", "last")) == 0
    checkpoint = last_checkpoint(run)
    assert checkpoint["global_step"] == 3
    assert checkpoint[LORA_KEY]["tokens"] == MARKERS


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        (["--model.lora.rank", "0"], "error: model lora rank must be at least 1, got 0"),
        (
            ["--model.lora.targets", "[W_query, c_attn]"],
            "error: model lora targets: no layer 'c_attn' in a block; "
            "the layers are W_query, W_key, W_value, out_proj, c_fc, c_proj",
        ),
    ],
    ids=["rank 0", "unknown target"],
)
def test_a_bad_lora_setting_is_one_line(
    files: tuple[Path, Path],
    setting: list[str],
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert train_main(lora_args(files, tmp_path / "run", *setting)) == 2
    assert capsys.readouterr().err.splitlines() == [said]


def test_resuming_with_other_adapters_is_refused_in_one_line(
    files: tuple[Path, Path],
    straight: tuple[Path, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    checkpoint = resolve_checkpoint(straight[0]).parent / "last.ckpt"
    args = lora_args(files, tmp_path / "run", "--ckpt_path", str(checkpoint), "--model.lora", "null")
    assert train_main(args) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: checkpoint was trained with model.lora rank 8, alpha 16.0, targets ['W_query', 'W_value']: "
        "set the same to resume it"
    )


def test_the_adapters_train_with_adamw_whichever_optimizer() -> None:
    """Muon would take them as the blocks' matrices; AdamW does (training/optim.py says why)."""
    model = GPT(TINY)
    add_adapters(model, LoRAConfig(rank=4))
    optimizer = build_optimizer(model, OptimConfig(optimizer="muon"))
    assert isinstance(optimizer, torch.optim.AdamW)
    given = [p for group in optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in given} == {id(p) for n, p in model.named_parameters() if is_adapter(n)}


def test_a_training_step_computes_through_the_adapters() -> None:
    """With gradients on, attention stacks its three projections into one product, which would
    leave their adapters out: with adapters it computes what inference does."""
    torch.manual_seed(0)
    model = GPT(TINY)
    add_adapters(model, LoRAConfig(rank=4, dropout=0.0, targets=("W_query", "W_key", "W_value")))
    for name, parameter in model.named_parameters():
        if ".lora_B." in name:
            nn.init.normal_(parameter, std=0.5)  # B starts at zero: make the adapters count
    x = torch.randint(0, TINY.vocab_size, (2, TINY.context_length))
    model.eval()
    with torch.no_grad():
        inference = model(x)
    torch.testing.assert_close(model(x), inference)


def test_an_untied_head_trains_its_markers_rows_too(tmp_path: Path) -> None:
    """The embedding's and the head's rows of new tokens train, each their own, and no other row;
    the merged weights, and the adapters written alone on the starting weights, compute the same."""
    torch.manual_seed(0)
    untied = replace(TINY, tie_weights=False)
    start = GPT(untied)
    add_token_rows(start, TINY.vocab_size + 2, trained=TINY.vocab_size)
    new = [TINY.vocab_size, TINY.vocab_size + 1]
    model = copy.deepcopy(start)
    lora = LoRAConfig(rank=4, dropout=0.0)
    add_adapters(model, lora, new)
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.0))
    x = torch.randint(0, TINY.vocab_size + 2, (4, TINY.context_length))
    x[:, ::4], x[:, 1::4] = new  # each new token read and written
    for _ in range(3):
        next_token_loss(model(x), x.roll(-1, dims=1)).backward()
        optimizer.step()
        optimizer.zero_grad()
    state = model.state_dict()
    merged = GPT(start.config)
    merged.load_state_dict(merge_lora(state, lora.alpha / lora.rank, new))
    for table in ("transformer.wte", "lm_head"):
        before, after = start.get_submodule(table).weight, merged.get_submodule(table).weight
        assert torch.equal(after[: TINY.vocab_size], before[: TINY.vocab_size]), table
        assert all(not torch.equal(after[i], before[i]) for i in new), table
    assert not torch.equal(merged.lm_head.weight[new], merged.transformer.wte.weight[new])
    model.eval()
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(merged(x), expected)
        save_adapter(model, state, tmp_path, base=None)
        alone = copy.deepcopy(start)
        load_adapter(alone, tmp_path)
        torch.testing.assert_close(alone.eval()(x), expected)


def test_new_tokens_rows_are_decayed_as_their_tables_are() -> None:
    """As full training decays the embedding and the head, and gives the embedding its own
    learning rate where one is set."""
    model = GPT(replace(TINY, tie_weights=False))
    add_adapters(model, LoRAConfig(rank=4), [48, 49])
    rows = {id(p): name.partition(".")[0] for name, p in model.named_parameters() if is_token_rows(name)}
    assert sorted(rows.values()) == ["lm_head", "transformer"]
    for config, groups in [
        (OptimConfig(), {"decay": ["lm_head", "transformer"]}),
        (OptimConfig(embedding_lr=1e-3), {"decay": ["lm_head"], "embeddings": ["transformer"]}),
    ]:
        given = {
            group["name"]: sorted(rows[id(p)] for p in group["params"] if id(p) in rows)
            for group in build_optimizer(model, config).param_groups
        }
        assert {name: found for name, found in given.items() if found} == groups
