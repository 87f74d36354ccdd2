"""LightningDataModule that serves context windows from prepared token files."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from minigpt.common import another_folder_with, short_count

from .config import CountsBatches, DataConfig
from .errors import DataError
from .loader import ResumableLoader
from .prepare import PreparedData, open_prepared, prepare
from .tokenizer import Tokenizer
from .windows import TokenWindows, TrainWindowSampler, ValWindowSampler, validated_windows


class TextDataModule(CountsBatches, L.LightningDataModule):
    """Batches of ``(x, y)``, each ``(B, T)`` int64, with ``y`` the next tokens of ``x``.

    ``prepare_data`` tokenizes the corpus once (Lightning calls it on one process per node, then
    makes the others wait); ``setup`` only finds the same prepared files, checks every shard, opens
    them read-only and builds :attr:`tokenizer`. It never prepares: files missing there are an error.

    Training windows start at random offsets drawn from ``(config.seed, epoch)``; there are about
    ``train_tokens / context_length`` of them, so an epoch covers roughly the corpus once. The
    train loader is a :class:`ResumableLoader` over a :class:`TrainWindowSampler`: Lightning's
    ``set_epoch`` gives every epoch fresh windows (no dataloader reloading needed), each DDP rank
    reads its own share (the rank comes from the attached trainer, so Lightning leaves the sampler
    alone), and checkpoints record how many batches of the epoch were trained on, so a resumed run
    sees exactly the batches the uninterrupted run would have. The batches depend only on the seed,
    the epoch and the number of ranks, never on ``num_workers``.

    Validation windows are fixed (:func:`val_offsets`): back to back over the validation split, or
    ``config.val_tokens`` worth of them spread evenly over it when it is larger, so validation
    stays cheap on a large corpus and its loss compares across runs, devices and resumes. The
    budget is the whole validation's, dealt to the ranks (:class:`ValWindowSampler`), and so is
    a whole-number ``limit_val_batches``: one process and N score the same windows.
    """

    # The default instance is frozen, so sharing it between calls is safe.
    def __init__(self, config: DataConfig = DataConfig(), context_length: int = 128) -> None:  # noqa: B008
        """
        Args:
            config: Data source, tokenizer, caching and batching settings.
            context_length: ``T``, tokens per training sequence (the model's context length).
        """
        super().__init__()
        if context_length < 1:
            raise DataError(f"context_length must be at least 1, got {context_length}")
        self.config = config
        self.context_length = context_length
        self._prepared: PreparedData | None = None
        self._tokenizer: Tokenizer | None = None

    def prepare_data(self) -> None:
        # Kept only as a shortcut for setup() in this same process; other ranks find the files
        # again through open_prepared().
        with another_folder_with("--data.config.cache_dir"):
            self._prepared = prepare(self.config, context_length=self.context_length)

    def setup(self, stage: str | None = None) -> None:
        if self._tokenizer is not None:
            return
        if self._prepared is None:
            self._prepared = open_prepared(self.config, context_length=self.context_length)
        self._tokenizer = self._prepared.tokenizer(self.config.tokenizer_path)

    @property
    def prepared(self) -> PreparedData:
        """The prepared files in use (after :meth:`setup`)."""
        if self._prepared is None or self._tokenizer is None:
            raise RuntimeError("TextDataModule.setup() must run before its data is used")
        return self._prepared

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer the data was prepared with (after :meth:`setup`)."""
        if self._tokenizer is None:
            raise RuntimeError("TextDataModule.setup() must run before tokenizer is used")
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Number of token ids, ``tokenizer.n_vocab``."""
        return self.tokenizer.n_vocab

    def train_tokens(self) -> int:
        """Tokens of the training split."""
        return self.prepared.num_tokens("train")

    def summary(self) -> str:
        """What the data is, for the run's summary."""
        prepared = self.prepared
        return (
            f"{prepared.meta['source']}, {self.config.tokenizer} tokens: {short_count(self.train_tokens())} "
            f"for training, {short_count(prepared.num_tokens('val'))} for validation"
        )

    def train_dataset(self) -> TokenWindows:
        """Every window of the training split."""
        prepared = self.prepared
        return TokenWindows(prepared.segments("train"), prepared.meta["dtype"], self.context_length)

    def val_dataset(self) -> TokenWindows:
        """Every window of the validation split (see :func:`val_offsets` for those scored)."""
        prepared = self.prepared
        return TokenWindows(prepared.segments("val"), prepared.meta["dtype"], self.context_length)

    def train_sampler(self, num_replicas: int = 1, rank: int = 0) -> TrainWindowSampler:
        """Rank ``rank``'s share of the training windows (call ``set_epoch`` to pick the epoch)."""
        return TrainWindowSampler(
            self.train_dataset(), self.config.seed, num_replicas, rank, least_per_rank=self.config.batch_size
        )

    def train_dataloader(self) -> ResumableLoader:
        trainer = self.trainer
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        sampler = self.train_sampler(num_replicas, rank)
        return ResumableLoader(sampler.windows, sampler=sampler, drop_last=True, **self._loader_options())

    def val_windows(self, limit_batches: int | float | None = None) -> list[int]:
        """The windows one validation scores, over every rank together (:func:`validated_windows`):
        ``config.val_tokens`` worth, and at most ``limit_batches`` batches of them when that is a
        whole number (the trainer's ``limit_val_batches``)."""
        return validated_windows(
            self.val_dataset(), self.config.val_tokens, limit_batches, self.config.batch_size
        )

    def val_dataloader(self) -> DataLoader:
        trainer = self.trainer
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        dataset = self.val_dataset()
        offsets = self.val_windows(trainer.limit_val_batches if trainer is not None else None)
        if 0 < len(offsets) < num_replicas:
            # A rank with no window would skip the first validation forward, in which DDP
            # broadcasts the model's buffers, and the others would wait for it forever.
            raise DataError(
                f"validation has {len(offsets)} window(s) of {self.context_length} tokens for {num_replicas}"
                " processes: give it more (data.config.val_fraction, val_tokens) or use fewer processes"
            )
        sampler = ValWindowSampler(dataset, offsets, num_replicas, rank)
        return DataLoader(dataset, sampler=sampler, drop_last=False, **self._loader_options())

    def _loader_options(self) -> dict[str, Any]:
        return loader_options(self.config.batch_size, self.config.num_workers, self.config.seed)


def loader_options(batch_size: int, num_workers: int, seed: int) -> dict[str, Any]:
    """The DataLoader settings every data module here shares."""
    return {
        "batch_size": batch_size,
        "num_workers": num_workers,
        "pin_memory": torch.cuda.is_available(),
        "persistent_workers": num_workers > 0,
        # Every new iterator draws a seed for its workers; from the global generator, that
        # draw would shift the random state dropout uses, and a resumed run (whose train
        # iterator starts at a different moment) would no longer repeat the original.
        "generator": torch.Generator().manual_seed(seed),
    }
