"""ResumableLoader: a run stopped mid-epoch resumes with exactly the batches it would have seen."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from minigpt.data import DataConfig, ResumableLoader, TextDataModule, TokenWindows

T = 16
TEXT = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))


def _datamodule(
    source: Path, num_workers: int = 0, batch_size: int = 4, shard_tokens: int = 1 << 27
) -> TextDataModule:
    config = DataConfig(
        source=str(source),
        tokenizer="char",
        batch_size=batch_size,
        num_workers=num_workers,
        shard_tokens=shard_tokens,
    )
    dm = TextDataModule(config, T)
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.fixture
def source(tmp_path: Path, data_cache: Path) -> Path:
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    return tmp_path / "corpus.txt"


def _epoch(loader: ResumableLoader, epoch: int, limit: int | None = None) -> list[torch.Tensor]:
    loader.sampler.set_epoch(epoch)
    batches = []
    for x, _ in loader:
        batches.append(x)
        if len(batches) == limit:
            break
    return batches


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(("num_workers", "shard_tokens"), [(0, 1 << 27), (2, 1 << 27), (2, 256)])
@pytest.mark.parametrize("stop", [1, 7])
def test_resume_mid_epoch_continues_the_uninterrupted_run(
    source: Path, num_workers: int, shard_tokens: int, stop: int
) -> None:
    straight = _datamodule(source, num_workers, shard_tokens=shard_tokens).train_dataloader()
    expected = [_epoch(straight, 0), _epoch(straight, 1)]
    if shard_tokens == 256:  # 12 shards of training text: the windows come from all of them
        segments = straight.dataset.segments
        assert len(segments) == 12
        assert len({straight.dataset.locate(i)[0] for i in straight.sampler.offsets()}) == len(segments)

    first = _datamodule(source, num_workers, shard_tokens=shard_tokens).train_dataloader()
    seen = _epoch(first, 1, limit=stop)
    state = first.state_dict()
    # Workers have prefetched further; only batches handed out count.
    assert state == {"epoch": 1, "batches": stop, "batch_size": 4, "num_replicas": 1}

    resumed = _datamodule(source, num_workers, shard_tokens=shard_tokens).train_dataloader()
    resumed.load_state_dict(state)
    rest = _epoch(resumed, 1)  # Lightning calls set_epoch again, with the same epoch
    assert _same(seen + rest, expected[1])
    assert resumed.state_dict()["batches"] == len(expected[1])
    assert _same(_epoch(resumed, 0), expected[0])  # the skip applied to one iteration only


def test_the_same_seed_gives_the_same_batches_on_any_number_of_workers(source: Path) -> None:
    batches = [_epoch(_datamodule(source, workers).train_dataloader(), 2) for workers in (0, 1, 2)]
    assert _same(batches[0], batches[1]) and _same(batches[0], batches[2])


def test_skipped_batches_are_never_read(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = _datamodule(source).train_dataloader()
    loader.sampler.set_epoch(0)
    offsets = loader.sampler.offsets()
    reads: list[int] = []
    read = TokenWindows.__getitem__
    monkeypatch.setattr(TokenWindows, "__getitem__", lambda self, i: reads.append(i) or read(self, i))
    loader.load_state_dict({"epoch": 0, "batches": 5})
    next(iter(loader))
    assert reads == offsets[20:24].tolist()


def test_state_dict_round_trip(source: Path) -> None:
    loader = _datamodule(source).train_dataloader()
    assert loader.state_dict() == {"epoch": 0, "batches": 0, "batch_size": 4, "num_replicas": 1}
    state = {"epoch": 3, "batches": 9, "batch_size": 4, "num_replicas": 1}
    loader.load_state_dict(state)
    assert loader.state_dict() == state and loader.sampler.epoch == 3
    other = _datamodule(source).train_dataloader()
    other.load_state_dict(loader.state_dict())
    rest = _epoch(loader, 3)
    assert len(rest) == len(loader) - 9 and _same(_epoch(other, 3), rest)


def test_a_resume_point_from_a_finished_epoch_is_dropped_when_the_next_one_starts(source: Path) -> None:
    loader = _datamodule(source).train_dataloader()
    expected = _epoch(loader, 1)
    loader.load_state_dict({"epoch": 0, "batches": len(loader), "batch_size": 4, "num_replicas": 1})
    assert _same(_epoch(loader, 1), expected)


def test_resume_with_another_batch_size_continues_at_the_same_window(source: Path) -> None:
    four = _datamodule(source).train_dataloader()
    _epoch(four, 0, limit=3)
    two = _datamodule(source, batch_size=2).train_dataloader()
    two.load_state_dict(four.state_dict())
    assert two.state_dict()["batches"] == 6
    rest = torch.cat(_epoch(two, 0))
    assert torch.equal(rest[: 4 * 4], torch.cat(_epoch(_datamodule(source).train_dataloader(), 0)[3:7]))


class _Recorder(L.Callback):
    """Keeps every training batch's inputs, in order."""

    def __init__(self) -> None:
        self.inputs: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch, batch_idx) -> None:
        self.inputs.append(batch[0].clone())


class _Bigram(L.LightningModule):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = torch.nn.Embedding(vocab_size, vocab_size)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.embedding(x).flatten(0, 1), y.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def _fit(
    source: Path, folder: Path, accumulate: int, num_workers: int, ckpt_path: Path | None = None
) -> tuple[_Recorder, _Bigram]:
    datamodule = _datamodule(source, num_workers)
    module, recorder = _Bigram(datamodule.vocab_size), _Recorder()
    every_step = ModelCheckpoint(dirpath=folder, filename="{step}", every_n_train_steps=1, save_top_k=-1)
    trainer = L.Trainer(
        max_steps=8,
        limit_train_batches=6,  # epochs end early, so the run crosses epoch boundaries
        limit_val_batches=0,
        accumulate_grad_batches=accumulate,
        accelerator="cpu",
        logger=False,
        callbacks=[recorder, every_step],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    return recorder, module


@pytest.mark.parametrize(
    ("accumulate", "resume_step", "num_workers"),
    [(1, 3, 0), (1, 6, 0), (1, 7, 0), (2, 2, 0), (2, 5, 0), (1, 6, 2), (2, 5, 2)],
)
def test_lightning_resume_sees_the_batches_of_the_uninterrupted_run(
    source: Path, tmp_path: Path, accumulate: int, resume_step: int, num_workers: int
) -> None:
    straight, straight_module = _fit(source, tmp_path / "straight", accumulate, num_workers)
    checkpoint = tmp_path / "straight" / f"step={resume_step}.ckpt"
    resumed, resumed_module = _fit(source, tmp_path / "resumed", accumulate, num_workers, checkpoint)
    # Batches per optimizer step: `accumulate`, except the last step of each 6-batch epoch when odd.
    steps_per_epoch = -(-6 // accumulate)
    epochs, step_in_epoch = divmod(resume_step, steps_per_epoch)
    done = 6 * epochs + min(6, step_in_epoch * accumulate)
    assert len(straight.inputs) > done > 0
    assert _same(resumed.inputs, straight.inputs[done:])
    for a, b in zip(straight_module.parameters(), resumed_module.parameters(), strict=True):
        assert torch.equal(a, b)
