"""LightningDataModule that serves context windows from prepared token files."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from .config import DataConfig
from .errors import DataError
from .prepare import PreparedData, prepare
from .tokenizer import Tokenizer
from .windows import TokenWindows, train_windows, val_windows


class TextDataModule(L.LightningDataModule):
    """Batches of ``(x, y)``, each ``(B, T)`` int64, with ``y`` the next tokens of ``x``.

    ``prepare_data`` tokenizes the corpus once (on one process per node); ``setup`` finds the same
    prepared files, opens them read-only and builds :attr:`tokenizer`.

    Training windows start at random offsets drawn from ``(config.seed, epoch)``; there are about
    ``train_tokens / context_length`` of them, so an epoch covers roughly the corpus once. The
    epoch is read from the attached trainer when the loader is built: with
    ``Trainer(reload_dataloaders_every_n_epochs=1)`` each epoch draws fresh windows, otherwise every
    epoch revisits the first epoch's windows. Loaders use ``shuffle=False`` because the offsets are
    already random; under DDP, Lightning's DistributedSampler splits the windows between ranks.

    Validation windows are fixed and back to back over the validation split. To cap validation
    cost on a large corpus, use ``Trainer(limit_val_batches=...)``.
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
        # again through prepare()'s cache.
        self._prepared = prepare(self.config, context_length=self.context_length)

    def setup(self, stage: str | None = None) -> None:
        if self._tokenizer is not None:
            return
        if self._prepared is None:
            self._prepared = prepare(self.config, context_length=self.context_length)
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

    def train_dataset(self, epoch: int = 0) -> TokenWindows:
        """The training windows of ``epoch``."""
        prepared = self.prepared
        return train_windows(
            prepared.directory / "train.bin",
            prepared.meta["dtype"],
            prepared.num_tokens("train"),
            self.context_length,
            self.config.seed,
            epoch,
        )

    def val_dataset(self) -> TokenWindows:
        """The validation windows."""
        prepared = self.prepared
        path, dtype = prepared.directory / "val.bin", prepared.meta["dtype"]
        return val_windows(path, dtype, prepared.num_tokens("val"), self.context_length)

    def train_dataloader(self) -> DataLoader:
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        return self._loader(self.train_dataset(epoch), drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset(), drop_last=False)

    def _loader(self, dataset: TokenWindows, drop_last: bool) -> DataLoader:
        workers = self.config.num_workers
        return DataLoader(
            dataset,
            batch_size=self.config.batch_size,
            shuffle=False,
            num_workers=workers,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=workers > 0,
            drop_last=drop_last,
        )
