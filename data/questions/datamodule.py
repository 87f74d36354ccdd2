"""`QuestionsDataModule`: questions with checkable answers, for reinforcement learning (rl.yaml).

Each row asks a question (``instruction``) and names its right answer among ``choices`` by its
index, ``label``; any other field is kept for the reward function (the play questions' ``kind``,
``play``, ``output``). Training batches are the questions' prompts, through the one chat template
with the weights' tokenizer and the role markers, as fine-tuning and the server prompt; the model
writes the answers itself. Validation batches score each held-out question's choices by their
log-likelihood after the prompt, as evaluate.py's multiple-choice tasks score them
(``play_next_line``, ``play_speakers``): the choice's text right after the assistant's marker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, DistributedSampler

from ..chat.template import ChatEncoder
from ..config import CountsBatches, check_batching
from ..corpus import resolve_corpus
from ..datamodule import loader_options
from ..errors import DataError
from ..loader import EpochShuffle, ResumableLoader
from ..tokenizer import ChatTokenizer, tokenizer_from_spec, with_chat_tokens
from .batches import Choices, HeldOut, Prompts, choice_batch, pad_prompts


@dataclass(frozen=True)
class QuestionsConfig:
    """Where the questions come from, which are asked, and how many at a time."""

    source: str = "data_cache/play_questions/train.jsonl"
    """A .jsonl/.json/.parquet file or folder of questions (instruction, choices, label), or a hub dataset."""
    val_source: str = "data_cache/play_questions/test.jsonl"
    """The held-out questions whose choices validation scores."""
    split: str = "train"
    """Split of a hub dataset (val_source's: `test`)."""
    kinds: list[str] | None = None
    """Ask only rows whose `kind` is one of these (the play questions': speaker, next_line); null: all."""
    val_questions: int | None = 256
    """Held-out questions scored at each validation, the same ones every time, drawn by the seed
    across kinds; null: all of them."""
    batch_size: int = 8
    """Questions per batch on each device (each gets the model's group of answers)."""
    num_workers: int = 0
    """DataLoader worker processes (0 reads in the training process)."""
    seed: int = 1337
    """Seed for the order of each epoch's questions and the held-out ones scored."""
    tokenizer_path: str | None = None
    """Path to GPT-2's r50k_base.tiktoken ranks file, for machines that cannot download it."""

    def __post_init__(self) -> None:
        check_batching(self)
        if self.val_questions is not None and self.val_questions < 1:
            raise DataError(f"val_questions must be at least 1 or null, got {self.val_questions}")


def read_questions(source: str, split: str, kinds: Sequence[str] | None) -> list[dict[str, Any]]:
    """Every row of `source` of the `kinds` asked, each checked.

    Raises:
        DataError: The source cannot be read, a row lacks its question, choices or label (named
            with its file and row), or no row is left.
    """
    import datasets

    corpus = resolve_corpus(source, split=split)
    if corpus.hub_dataset is None and corpus.builder not in ("json", "parquet"):
        raise DataError(f"{corpus.description} is not question data (.jsonl, .json, .parquet)")
    tables = [(corpus.description, corpus.hub_dataset)] if corpus.hub_dataset is not None else []
    for path in corpus.files:
        try:
            tables.append(
                (str(path), datasets.load_dataset(corpus.builder, data_files=[str(path)], split="train"))
            )
        except Exception as error:  # datasets and pyarrow raise many kinds for a malformed file
            raise DataError(f"could not read {path}: {str(error).splitlines()[0]}") from None
    rows = []
    for name, table in tables:
        for number, row in enumerate(table, start=1):
            check_question(row, f"{name}, row {number}")
            if kinds is None or row.get("kind") in kinds:
                rows.append(dict(row))
    if not rows:
        asked = "" if kinds is None else f" of kind {', '.join(kinds)}"
        raise DataError(f"{corpus.description} has no questions{asked}")
    return rows


def check_question(row: dict[str, Any], where: str) -> None:
    """Refuse a row without its question text, choices (at least two texts) and the right one's index."""
    choices = row.get("choices")
    if not isinstance(row.get("instruction"), str):
        raise DataError(f"{where} has no 'instruction' text (a question row has instruction, choices, label)")
    if (
        not isinstance(choices, list)
        or len(choices) < 2
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise DataError(f"{where}: 'choices' must be a list of at least two non-empty texts")
    label = row.get("label")
    if not isinstance(label, int) or not 0 <= label < len(choices):
        raise DataError(f"{where}: 'label' must be the index of the right choice, 0 to {len(choices) - 1}")


class QuestionsDataModule(CountsBatches, L.LightningDataModule):
    """Training batches `(prompts, lengths, indices)` (`pad_prompts`); validation batches
    `(x, y, counts, chars, labels, kinds)` (`choice_batch`). `question(i)` is the training row of index i, for
    the reward; `kinds` names the kinds validation counts apart.

    Questions whose prompt leaves no room for an answer within the context are left out, and
    counted in the summary. The tokenizer is the weights' (`use_tokenizer`, from model.init_from)
    with the chat markers.
    """

    def __init__(self, questions: QuestionsConfig = QuestionsConfig(), context_length: int = 128) -> None:
        """
        Args:
            questions: Where the questions come from, and how many a batch asks.
            context_length: The model's context length: a prompt and its answer fit in it.
        """
        super().__init__()
        self.config = questions
        """The settings, under the name the other data modules' have (the batch size is read from it)."""
        self.context_length = context_length
        self._base_spec: dict[str, Any] | None = None
        self._tokenizer: ChatTokenizer | None = None
        self._rows: list[dict[str, Any]] = []
        self._prompts: Prompts | None = None
        self._choices: Choices | None = None
        self.kinds: list[str] = []
        """The held-out questions' kinds, in the order validation's `kinds` index them."""
        self._left_out = 0

    def use_tokenizer(self, spec: dict[str, Any]) -> None:
        """Read the questions with the tokenizer ``spec`` describes (the weights'), plus the markers."""
        self._base_spec = spec

    def setup(self, stage: str | None = None) -> None:
        if self._prompts is not None:
            return
        if self._base_spec is None:
            raise DataError(
                "questions are read with the tokenizer of the weights they train: set --model.init_from"
            )
        tokenizer = with_chat_tokens(tokenizer_from_spec(self._base_spec, self.config.tokenizer_path))
        encoder = ChatEncoder(tokenizer)
        rows = read_questions(self.config.source, self.config.split, self.config.kinds)
        prompts = []
        for row in rows:
            ids = encoder.prompt_ids([{"role": "user", "content": row["instruction"]}])
            if len(ids) < self.context_length:
                self._rows.append(row)
                prompts.append(ids)
        self._left_out = len(rows) - len(prompts)
        if not prompts:
            raise DataError(
                f"no question of {self.config.source} fits the context of {self.context_length} ids"
            )
        self._prompts = Prompts(prompts)
        self._choices = self._held_out(encoder)
        self._tokenizer = tokenizer

    def _held_out(self, encoder: ChatEncoder) -> Choices:
        rows = read_questions(self.config.val_source, "test", self.config.kinds)
        order = np.random.default_rng(self.config.seed).permutation(len(rows))
        chosen = [rows[i] for i in sorted(order[: self.config.val_questions])]
        self.kinds = sorted({str(row.get("kind", "")) for row in chosen})
        scored = []
        for row in chosen:
            prompt = encoder.prompt_ids([{"role": "user", "content": row["instruction"]}])
            choices = [encoder.tokenizer.encode(choice) for choice in row["choices"]]
            # Cropped on the left as lm-eval's models crop: the choice whole, the prompt's start dropped.
            sequences = [(prompt + ids)[-(self.context_length + 1) :] for ids in choices]
            lengths, chars = [len(ids) for ids in choices], [len(choice) for choice in row["choices"]]
            kind = self.kinds.index(str(row.get("kind", "")))
            scored.append(HeldOut(sequences, lengths, chars, row["label"], kind))
        return Choices(scored)

    @property
    def tokenizer(self) -> ChatTokenizer:
        """The weights' tokenizer with the chat markers (after :meth:`setup`)."""
        if self._tokenizer is None:
            raise RuntimeError("QuestionsDataModule.setup() must run before tokenizer is used")
        return self._tokenizer

    def question(self, index: int) -> dict[str, Any]:
        """The training question of `index` (a batch's `indices`), as its row holds it."""
        return self._rows[index]

    def train_tokens(self) -> int:
        """Ids the training prompts hold."""
        return sum(len(ids) for ids in self._prompts.prompts)

    batch_rows = ("questions", 1)
    """A row of a batch: a question's prompt (`micro_batch`); the answers come on top."""

    def summary(self) -> str:
        """What the data is, for the run's summary."""
        left_out = f" ({self._left_out:,} left out: no room for an answer)" if self._left_out else ""
        return (
            f"{self.config.source}, {self.tokenizer.name} tokens and chat markers: {len(self._prompts):,} "
            f"questions{left_out} for training; {len(self._choices):,} held-out questions of "
            f"{self.config.val_source} scored by their choices"
        )

    def train_dataloader(self) -> ResumableLoader:
        trainer = self.trainer
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        if len(self._prompts) < num_replicas * self.config.batch_size:
            raise DataError(
                f"{len(self._prompts)} questions cannot fill a batch of {self.config.batch_size} on "
                f"{num_replicas} process(es): lower data.questions.batch_size"
            )
        sampler = EpochShuffle(self._prompts, self.config.seed, num_replicas, rank)
        pad = self.tokenizer.end_id
        options = loader_options(self.config.batch_size, self.config.num_workers, self.config.seed)
        return ResumableLoader(
            self._prompts,
            sampler=sampler,
            drop_last=True,
            collate_fn=partial(pad_prompts, pad_id=pad),
            **options,
        )

    def val_dataloader(self) -> DataLoader:
        trainer = self.trainer
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        sampler = DistributedSampler(self._choices, num_replicas, rank, shuffle=False, drop_last=False)
        pad = self.tokenizer.end_id
        options = loader_options(self.config.batch_size, self.config.num_workers, self.config.seed)
        return DataLoader(
            self._choices, sampler=sampler, collate_fn=partial(choice_batch, pad_id=pad), **options
        )
