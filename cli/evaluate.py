"""`evaluate.py`: how good is a model? A run's own validation bits per byte, bits per byte and
perplexity on any text, and any task of lm-evaluation-harness; printed as a table and written as
JSON next to the model."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from minigpt.checkpoints import load_model, resolve_checkpoint
from minigpt.common import UsageError, another_folder_with, data_settings
from minigpt.evaluation.lm_eval import Score
from minigpt.evaluation.results import table, write_results
from minigpt.evaluation.text import read_documents, score_text

from .command import USER_ERRORS, options_parser, parse_options, report

RESULTS_FILE = "evaluation.json"
"""Beside the model (in a run folder, or next to a model file): the results, unless --out says."""


@dataclass(frozen=True)
class EvaluateOptions:
    """What to evaluate, on what, and where the results go."""

    checkpoint: str
    """A run folder (its best checkpoint), a .ckpt or .safetensors file, or a GPT-2 folder."""
    text: str | None = None
    """Score bits per byte and perplexity on this text: anything data.config.source takes (a .txt,
    .jsonl, .json or .parquet file, a folder of them, a hub dataset, shakespeare). Without --text
    and --tasks, a run folder is scored on its own validation windows, from the folder the run was
    started in: the run's val_loss and val_bpb, exactly as it last validated the checkpoint."""
    subset: str | None = None
    """The hub dataset's named configuration, for --text."""
    split: str = "train"
    """The hub dataset's split, for --text."""
    text_column: str = "text"
    """The column holding the text in JSON, parquet and hub datasets."""
    tail: float | None = None
    """Score only the last fraction of the --text's characters (0 < tail <= 1; the same text for
    every tokenizer). Default: 1."""
    context_length: int | None = None
    """Tokens per window for --text (default: the model's context length)."""
    stride: int | None = None
    """Tokens between window starts for --text (default: the context length, back-to-back windows as
    validation scores them; smaller gives each token more context, at a higher cost)."""
    tasks: str | None = None
    """lm-evaluation-harness tasks, comma-separated (hellaswag,arc_easy,lambada_openai, or tasks in
    --include_path). Needs the eval extra."""
    include_path: str | None = None
    """A folder of lm-eval task YAML files of your own (they run offline on local data)."""
    limit: int | None = None
    """Score at most this many documents of each task (a quick look; the stderr says how quick)."""
    num_fewshot: int | None = None
    """Examples in each prompt (default: each task's own)."""
    apply_chat_template: bool | None = None
    """Prompt the tasks through the chat template (data/chat/chat_template.jinja): each question a
    user's message, each answer the assistant's reply, with the role markers of a model fine-tuned
    on conversations, in the template's plain USER:/ASSISTANT: form for a base model. Default: on
    for a model fine-tuned on conversations, off for a base model, so each reads prompts as it was
    trained."""
    batch_size: int = 16
    """Sequences per forward pass."""
    bootstrap_iters: int = 100_000
    """Resamples for the standard errors lm-eval bootstraps (as its own command line); 0: none."""
    device: str = "auto"
    """cpu, cuda, cuda:1, ... (auto: cuda when available)."""
    out: str | None = None
    """The JSON file to write (default: evaluation.json in the run folder, or beside the model file)."""
    force: bool = False
    """Replace the JSON file if it exists."""
    tokenizer_path: str | None = None
    """GPT-2's r50k_base.tiktoken ranks file, on machines that cannot fetch it."""
    seed: int = 1234
    """Seeds lm-eval's few-shot draws and any sampling."""

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"--limit must be at least 1 document, got {self.limit}")
        if self.tail is not None and not 0 < self.tail <= 1:
            raise UsageError(f"--tail must be in (0, 1], got {self.tail}")
        for name in ("batch_size", "context_length", "stride"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"--{name} must be at least 1, got {value}")
        if self.tasks is not None and not self.task_list:
            raise UsageError("--tasks is empty: name one or more tasks, comma-separated")

    @property
    def task_list(self) -> list[str]:
        return [name.strip() for name in (self.tasks or "").split(",") if name.strip()]


def run_settings(checkpoint: str) -> dict[str, Any] | None:
    """The settings of a run folder's last CSV version (its config.yaml), or None."""
    versions = sorted(
        Path(checkpoint).glob("csv/version_*/config.yaml"), key=lambda p: int(p.parent.name[8:])
    )
    if not Path(checkpoint).is_dir() or not versions:
        return None
    return yaml.safe_load(versions[-1].read_text(encoding="utf-8")) or {}


def evaluate_main(args: Sequence[str] | None = None) -> int:
    """Parse the command line, load the model, score it, print and write the results."""
    parser = options_parser(
        "evaluate.py",
        "Evaluate a trained model: bits per byte on a text, and lm-evaluation-harness tasks.",
        EvaluateOptions,
    )
    argv = list(sys.argv[1:] if args is None else args)
    try:
        (opts,) = parse_options(parser, argv, EvaluateOptions)
        text, tail, settings = opts.text, opts.tail if opts.tail is not None else 1.0, {}
        run = run_settings(opts.checkpoint) if text is None and not opts.tasks else None
        if text is None and not opts.tasks and run is None:
            raise UsageError(
                "nothing to evaluate: pass --text (a file, folder or dataset) and/or --tasks, or a run folder"
            )
        model_file = resolve_checkpoint(opts.checkpoint)
        out = Path(opts.out) if opts.out else _default_out(Path(opts.checkpoint), model_file)
        if out.exists() and not opts.force:
            raise UsageError(f"{out} already exists; pass --force to replace it, or --out another file")
        device = ("cuda" if torch.cuda.is_available() else "cpu") if opts.device == "auto" else opts.device
        model, tokenizer = load_model(model_file, device=device, tokenizer_path=opts.tokenizer_path)
        rows: list[Score] = []
        if run is not None:
            from minigpt.evaluation.validation import score_run_validation

            validation = score_run_validation(model, tokenizer, run)
            rows += [
                Score("validation", "bits_per_byte", validation.bits_per_byte, None, validation.bytes),
                Score("validation", "loss", validation.loss, None, validation.tokens),
            ]
            settings["validation"] = {**asdict(validation), "data": data_settings(run).get("config")}
            print(
                f"validation of {opts.checkpoint}: {validation.windows:,} windows, {validation.tokens:,} "
                f"{tokenizer.name} tokens, {validation.bytes:,} bytes",
                file=sys.stderr,
            )
        if text is not None:
            documents = read_documents(text, opts.subset, opts.split, opts.text_column, tail)
            score = score_text(model, tokenizer, documents, opts.context_length, opts.stride, opts.batch_size)
            rows += [
                Score("text", "bits_per_byte", score.bits_per_byte, None, score.bytes),
                Score("text", "token_perplexity", score.perplexity, None, score.tokens),
            ]
            settings["text"] = {
                "source": text,
                "subset": opts.subset,
                "tail": tail,
                "context_length": score.context_length,
                "stride": score.stride,
                "tokens": score.tokens,
                "bytes": score.bytes,
            }
            print(
                f"text: {text}, last {settings['text']['tail']:.0%} of it: {score.bytes:,} bytes, "
                f"{score.tokens:,} {tokenizer.name} tokens; windows of {score.context_length} tokens every "
                f"{score.stride}",
                file=sys.stderr,
            )
        if opts.tasks:
            from minigpt.data.tokenizer import ChatTokenizer
            from minigpt.evaluation.lm_eval import run_tasks

            chat = opts.apply_chat_template
            chat = isinstance(tokenizer, ChatTokenizer) if chat is None else chat
            task_rows, result = run_tasks(
                model,
                tokenizer,
                opts.task_list,
                opts.include_path,
                opts.limit,
                opts.num_fewshot,
                opts.batch_size,
                opts.bootstrap_iters,
                opts.seed,
                chat,
            )
            rows += task_rows
            settings["tasks"] = {
                "names": opts.task_list,
                "include_path": opts.include_path,
                "limit": opts.limit,
                "num_fewshot": {k: v for k, v in result.get("n-shot", {}).items()},
                "task_versions": result.get("versions", {}),
                "batch_size": opts.batch_size,
                "bootstrap_iters": opts.bootstrap_iters,
                "seed": opts.seed,
                "apply_chat_template": chat,
            }
        settings["model"] = {"file": str(model_file), "tokenizer": tokenizer.name, **asdict(model.config)}
        settings["device"] = str(device)
        with another_folder_with("--out"):
            write_results(out, str(opts.checkpoint), rows, settings, argv)
    except USER_ERRORS as err:
        return report(err)
    print(table(rows))
    print(f"written to {out}", file=sys.stderr)
    return 0


def _default_out(checkpoint: Path, model_file: Path) -> Path:
    if checkpoint.is_dir():
        return checkpoint / RESULTS_FILE
    return model_file.with_name(f"{model_file.name}.{RESULTS_FILE}")
