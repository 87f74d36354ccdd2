"""TextDataModule, its windows and samplers: targets, shapes, determinism, fresh epochs and DDP sharding."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from minigpt.data import DataConfig, DataError, ResumableLoader, TextDataModule, TrainWindowSampler
from minigpt.data.chat.conversations import ChatDataConfig
from minigpt.data.preference.datamodule import PreferenceDataConfig
from minigpt.data.questions.datamodule import QuestionsConfig

T = 16
TEXT = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))


@pytest.fixture
def datamodule(tmp_path: Path, data_cache: Path) -> TextDataModule:
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    dm = TextDataModule(DataConfig(source=str(tmp_path / "corpus.txt"), tokenizer="char", batch_size=4), T)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_batches_are_next_token_pairs_from_the_file(datamodule: TextDataModule) -> None:
    x, y = next(iter(datamodule.train_dataloader()))
    assert x.shape == y.shape == (4, T) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    tokens = datamodule.prepared.tokens("train")
    start = int(datamodule.train_sampler().offsets()[0])
    assert x[0].tolist() == tokens[start : start + T].tolist()
    assert y[0].tolist() == tokens[start + 1 : start + T + 1].tolist()
    assert datamodule.tokenizer.decode(x[0].tolist()) == TEXT[start : start + T]


def test_train_windows_cover_the_split_once_per_epoch(datamodule: TextDataModule) -> None:
    n = datamodule.prepared.num_tokens("train")
    windows, offsets = datamodule.train_dataset(), datamodule.train_sampler().offsets()
    assert len(offsets) == len(datamodule.train_sampler()) == n // T
    assert offsets.min() >= 0 and offsets.max() <= n - T - 1
    x, y = windows[n - T - 1]  # the last possible window still has its target
    assert x.shape == y.shape == (T,) and len(windows) == n - T
    with pytest.raises(IndexError):
        windows[n - T]


def test_offsets_depend_only_on_seed_and_epoch(datamodule: TextDataModule) -> None:
    def offsets(dm: TextDataModule, epoch: int = 0) -> np.ndarray:
        sampler = dm.train_sampler()
        sampler.set_epoch(epoch)
        return sampler.offsets()

    same = TextDataModule(datamodule.config, T)
    same.setup()
    assert np.array_equal(offsets(same), offsets(datamodule))
    other_seed = TextDataModule(DataConfig(**{**datamodule.config.__dict__, "seed": 7}), T)
    other_seed.setup()
    assert not np.array_equal(offsets(other_seed), offsets(datamodule))
    assert not np.array_equal(offsets(datamodule, 1), offsets(datamodule, 0))
    assert np.array_equal(offsets(datamodule, 1), offsets(same, 1))


def test_set_epoch_gives_the_same_loader_fresh_windows(datamodule: TextDataModule) -> None:
    loader = datamodule.train_dataloader()
    first = [x for x, _ in loader]
    loader.sampler.set_epoch(1)
    second = [x for x, _ in loader]
    loader.sampler.set_epoch(0)
    again = [x for x, _ in loader]
    assert len(first) == len(second) == len(loader) > 0
    assert not torch.equal(torch.cat(first), torch.cat(second))
    assert torch.equal(torch.cat(first), torch.cat(again))


def test_loader_takes_the_ranks_from_the_trainer(datamodule: TextDataModule) -> None:
    datamodule.trainer = SimpleNamespace(world_size=2, global_rank=1)  # what Lightning attaches
    sampler = datamodule.train_dataloader().sampler
    # A DistributedSampler is what keeps Lightning from wrapping or replacing it under DDP.
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle, sampler.drop_last) == (2, 1, False, True)


def test_validation_windows_are_fixed_and_back_to_back(datamodule: TextDataModule) -> None:
    n = datamodule.prepared.num_tokens("val")
    windows, loader = datamodule.val_dataset(), datamodule.val_dataloader()
    assert list(loader.sampler) == list(range(0, (n - 1) // T * T, T))
    targets = torch.cat([windows[i][1] for i in loader.sampler])
    tokens = datamodule.prepared.tokens("val")
    assert targets.tolist() == tokens[1 : len(targets) + 1].tolist()  # every target scored once
    batches = [b[0] for b in datamodule.val_dataloader()]
    assert torch.equal(torch.cat(batches), torch.cat([b[0] for b in datamodule.val_dataloader()]))


@pytest.mark.parametrize("epoch", [0, 3])
def test_two_ranks_split_the_epoch_between_them(datamodule: TextDataModule, epoch: int) -> None:
    samplers = [datamodule.train_sampler(num_replicas=2, rank=rank) for rank in (0, 1)]
    whole = datamodule.train_sampler()
    for sampler in [*samplers, whole]:
        sampler.set_epoch(epoch)
    table = whole.offsets()
    # Window j of the epoch goes to rank j % 2; the odd one out at the end goes to neither.
    assert len(samplers[0]) == len(samplers[1]) == len(table) // 2
    assert list(samplers[0]) == table[0 : len(table) // 2 * 2 : 2].tolist()
    assert list(samplers[1]) == table[1 : len(table) // 2 * 2 : 2].tolist()
    # Step by step, the two ranks' batches together are the next 8 windows of the epoch.
    loaders = []
    for rank in (0, 1):
        datamodule.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        loaders.append(datamodule.train_dataloader())
        loaders[-1].sampler.set_epoch(epoch)
    windows = datamodule.train_dataset()
    for step, (a, b) in enumerate(zip(*loaders, strict=True)):
        positions = [8 * step + j for j in (0, 2, 4, 6, 1, 3, 5, 7)]
        expected = torch.stack([windows[int(table[p])][0] for p in positions])
        assert torch.equal(torch.cat([a[0], b[0]]), expected)
    assert step + 1 == len(table) // 8


def test_worker_processes_read_the_memmap(datamodule: TextDataModule) -> None:
    loader = DataLoader(datamodule.train_dataset(), sampler=[0, 5, 9, 2], batch_size=4, num_workers=1)
    x, y = next(iter(loader))
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert datamodule.train_dataset().__getstate__()["_tokens"] == {}  # workers get paths, not the data


def test_loader_settings(datamodule: TextDataModule) -> None:
    loader = datamodule.train_dataloader()
    assert isinstance(loader, ResumableLoader) and isinstance(loader.sampler, TrainWindowSampler)
    assert loader.batch_size == 4 and loader.drop_last and loader.num_workers == 0
    assert not loader.persistent_workers and loader.pin_memory == torch.cuda.is_available()
    assert len(loader) == datamodule.prepared.num_tokens("train") // T // 4


def test_tokenizer_before_setup_is_a_clear_error() -> None:
    datamodule = TextDataModule(DataConfig(source="nowhere.txt"), 8)  # no I/O until prepare/setup
    with pytest.raises(RuntimeError, match="setup"):
        datamodule.tokenizer  # noqa: B018


def test_too_short_for_the_context_fails_in_prepare_data(tmp_path: Path, data_cache: Path) -> None:
    (tmp_path / "tiny.txt").write_text("abc" * 20, encoding="utf-8")
    datamodule = TextDataModule(DataConfig(source=str(tmp_path / "tiny.txt"), tokenizer="char"), 64)
    with pytest.raises(DataError, match="has 54 tokens but context_length 64 needs at least 65"):
        datamodule.prepare_data()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("val_fraction", 0.0, "val_fraction must be between 0 and 1"),
        ("val_fraction", 1.0, "val_fraction must be between 0 and 1"),
        ("batch_size", 0, "batch_size must be at least 1"),
        ("num_workers", -1, "num_workers must be 0 or more"),
        ("num_proc", -1, "num_proc must be 0 or more"),
        ("max_tokens", 0, "max_tokens must be at least 1"),
        ("shard_tokens", 100, "shard_tokens must be at least 256"),
        ("val_tokens", 0, "val_tokens must be at least 1"),
        (
            "tokenizer",
            "wordpiece",
            "unknown tokenizer 'wordpiece'; valid names: gpt2, gpt2-compact, char, bpe$",
        ),
        ("vocab_size", 4096, "data.vocab_size is an option of learned tokenizers \\(bpe\\), not gpt2$"),
        ("special_tokens", ("<s>",), "data.special_tokens is an option of learned tokenizers"),
        ("source", "", "source must not be empty"),
    ],
)
def test_config_validation(field: str, value: object, message: str) -> None:
    with pytest.raises(DataError, match=message):
        DataConfig(**{field: value})
    with pytest.raises(DataError, match="context_length must be at least 1"):
        TextDataModule(DataConfig(), 0)


REFUSALS = {
    "batch_size": (0, "batch_size must be at least 1, got 0"),
    "num_workers": (-1, "num_workers must be 0 or more, got -1"),
    "val_fraction": (1.0, "val_fraction must be between 0 and 1 (exclusive), got 1.0"),
}


@pytest.mark.parametrize(
    ("make", "prefix", "fields"),
    [
        (DataConfig, "data.", REFUSALS),
        (partial(ChatDataConfig, "chat.jsonl"), "", REFUSALS),
        (partial(PreferenceDataConfig, "pairs.jsonl"), "", REFUSALS),
        (QuestionsConfig, "", ("batch_size", "num_workers")),  # no val_fraction: held-out questions
    ],
    ids=["text", "chat", "preference", "questions"],
)
def test_every_kind_of_data_refuses_its_batching_settings_in_its_own_words(
    make: Callable[..., object], prefix: str, fields: Iterable[str]
) -> None:
    for field in fields:
        value, refusal = REFUSALS[field]
        with pytest.raises(DataError) as refused:
            make(**{field: value})
        assert str(refused.value) == prefix + refusal


def test_data_package_never_imports_model_or_training() -> None:
    package = Path(__file__).parents[2] / "data"
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith(("minigpt.model", "minigpt.training", "model", "training")), path


class _Counter(L.LightningModule):
    """The smallest module that trains on the batches and records which windows each epoch saw."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, vocab_size)
        self.first_inputs: list[list[int]] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        if batch_idx == 0:
            self.first_inputs.append(x[0].tolist())
        logits = self.embedding(x)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.embedding(x).flatten(0, 1), y.flatten()))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_fit_draws_fresh_windows_each_epoch_without_reloading(datamodule: TextDataModule) -> None:
    module = _Counter(datamodule.vocab_size)
    trainer = L.Trainer(
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=datamodule)
    assert len(module.first_inputs) == 2 and module.first_inputs[0] != module.first_inputs[1]
    assert torch.isfinite(trainer.callback_metrics["val_loss"])
