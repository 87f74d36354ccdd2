"""A run's own validation, again: the windows its validation scored, scored as it scored them.

Training validates on a fixed set of windows of its prepared data (`TextDataModule.val_windows`:
`data.config.val_tokens` worth, at most `limit_val_batches` batches of them over every process),
in batches of `data.config.batch_size`, under the trainer's precision, adding every target to a
`BitsPerByte`. Done again here with the run's settings (its `config.yaml`) and weights, that
gives the figures of the validation that made the checkpoint: the same windows and the same sums
in the same order as on one process; a run on N processes added the ranks' sums in another
order, a difference of float rounding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from minigpt.common import data_settings
from minigpt.data import DataConfig, DataError, Tokenizer
from minigpt.data.corpus import BUILTIN_SHAKESPEARE
from minigpt.data.prepare import open_prepared, prepare
from minigpt.data.windows import TokenWindows, validated_windows
from minigpt.model import GPT


@dataclass(frozen=True)
class ValidationScore:
    """What scoring a run's validation windows found."""

    windows: int
    """Windows scored, each of the model's context length."""
    tokens: int
    """Targets scored (end-of-text ones too)."""
    bytes: int
    """UTF-8 bytes those targets spell."""
    bits_per_byte: float
    loss: float
    """Mean loss per target, in nats: the run's val_loss."""


def run_data(settings: dict[str, Any]) -> DataConfig:
    """The run's data settings (`data.config` of its config.yaml)."""
    options = dict(data_settings(settings).get("config") or {})
    if options.get("special_tokens") is not None:
        options["special_tokens"] = tuple(options["special_tokens"])
    return DataConfig(**options)


def open_run_data(config: DataConfig, context_length: int) -> Any:
    """The run's prepared data: opened from its cache folder (relative to where the run started),
    prepared again there when it is gone and the text is on this machine (it gives the same
    tokens); a hub dataset's is never fetched again.

    Raises:
        DataError: The data is not prepared and comes from a hub dataset.
    """
    try:
        return open_prepared(config, context_length=context_length)
    except DataError as err:
        if config.source != BUILTIN_SHAKESPEARE and not Path(config.source).expanduser().exists():
            raise DataError(
                f"{err}; the run's validation data is not here (run evaluate.py from the folder the run "
                "was started in, or pass --text)"
            ) from err
        return prepare(config, context_length=context_length)


@contextmanager
def _precision(precision: str, device: torch.device) -> Iterator[None]:
    """Autocast as Lightning's trainer runs validation under `precision` (e.g. `bf16-mixed`)."""
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(str(precision))
    with torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext():
        yield


@torch.inference_mode()
def score_run_validation(model: GPT, tokenizer: Tokenizer, settings: dict[str, Any]) -> ValidationScore:
    """Score `model`, which reads `tokenizer`'s ids, on the validation windows of the run whose
    config.yaml gave `settings`.

    Raises:
        DataError: The run's data cannot be found, or was tokenized otherwise than the model reads.
    """
    from minigpt.training.loss import token_losses

    from .metrics import BitsPerByte  # here, not at the top: torchmetrics takes ~2 s to import

    config = run_data(settings)
    context_length = model.config.context_length
    prepared = open_run_data(config, context_length)
    windows = TokenWindows(prepared.segments("val"), prepared.meta["dtype"], context_length)
    trainer = settings.get("trainer") or {}
    offsets = validated_windows(
        windows, config.val_tokens, trainer.get("limit_val_batches"), config.batch_size
    )
    if prepared.tokenizer(config.tokenizer_path).spec() != tokenizer.spec():
        raise DataError(
            f"the run's data is tokenized with another {config.tokenizer} vocabulary than the model's"
        )
    device = next(model.parameters()).device
    score = BitsPerByte(tokenizer.byte_lengths(), sync_on_compute=False)
    chunk_rows = 256 if (settings.get("model") or {}).get("fused_loss") else None  # as LitGPT validates
    for start in range(0, len(offsets), config.batch_size):
        batch = [windows[i] for i in offsets[start : start + config.batch_size]]
        x = torch.stack([x for x, _ in batch]).to(device)
        y = torch.stack([y for _, y in batch]).to(device)
        with _precision(trainer.get("precision", "32-true"), device):
            losses = token_losses(model.features(x), model.lm_head.weight, y, chunk_rows)
        score.update(losses, y)
    total = {name: value.item() for name, value in score.compute().items()}
    return ValidationScore(
        len(offsets), int(total["targets"]), int(total["bytes"]), total["bpb"], total["loss"]
    )
