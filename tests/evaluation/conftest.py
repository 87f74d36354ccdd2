"""Small lm-eval tasks in its own formats, on local files, and models whose log-probabilities can
be computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from minigpt.model import GPT, GPTConfig

CHOICES = [
    # The context ends with a space: lm-eval moves it to the continuation, so GPT-2 sees " Paris",
    # one token, and not " " then "Paris". Each answer is one GPT-2 token with its leading space.
    {"question": "The capital of France is", "choices": ["Paris", "London", "Rome"], "label": 0},
    {"question": "Two plus two makes", "choices": ["four", "five"], "label": 0},
    {"question": "The sky at noon is", "choices": ["green", "blue", "red", "black"], "label": 1},
    {"question": "Ice is", "choices": ["cold", "hot"], "label": 0},
]
TEXTS = [
    # Longer than the models' 16-token context, so the rolling windows matter.
    {
        "text": "It was the best of times, it was the worst of times, it was the age of wisdom, "
        "it was the age of foolishness, it was the epoch of belief."
    },
    {"text": "Call me Ishmael. Some years ago, never mind how long precisely, having little money."},
]
PROMPTS = [{"prompt": "Once upon a time", "answer": " there"}, {"prompt": "ROMEO:", "answer": "\n"}]


def task_files(folder: Path) -> Path:
    """Three lm-eval tasks in `folder`: `mini_choice` (multiple choice), `mini_text` (rolling
    log-likelihood: perplexity and bits per byte) and `mini_generate` (generate until a stop)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("choice", CHOICES), ("text", TEXTS), ("generate", PROMPTS)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    def data(name: str) -> str:
        files = f"dataset_kwargs:\n  data_files:\n    test: {folder / name}.jsonl\n"
        return f"dataset_path: json\n{files}test_split: test\n"

    (folder / "mini_choice.yaml").write_text(
        "task: mini_choice\n" + data("choice") + "output_type: multiple_choice\n"
        'doc_to_text: "{{question}} "\ntarget_delimiter: ""\ndoc_to_choice: choices\ndoc_to_target: label\n'
        "metric_list:\n"
        "  - {metric: acc, aggregation: mean, higher_is_better: true}\n"
        "  - {metric: acc_norm, aggregation: mean, higher_is_better: true}\n"
    )
    (folder / "mini_text.yaml").write_text(
        "task: mini_text\n" + data("text") + "output_type: loglikelihood_rolling\n"
        'doc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n"
        "  - {metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}\n"
        "  - {metric: byte_perplexity, aggregation: weighted_perplexity, higher_is_better: false}\n"
        "  - {metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}\n"
    )
    (folder / "mini_generate.yaml").write_text(
        "task: mini_generate\n" + data("generate") + "output_type: generate_until\n"
        'doc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
        'generation_kwargs:\n  until: ["."]\n  max_gen_toks: 6\n  do_sample: false\n'
        "metric_list:\n  - {metric: exact_match, aggregation: mean, higher_is_better: true}\n"
    )
    return folder


@pytest.fixture(scope="session")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return task_files(tmp_path_factory.mktemp("tasks"))


def bigram_model(vocab_size: int, seed: int = 0) -> GPT:
    """A GPT whose next-token distribution depends on the current token alone: its blocks add
    nothing (zero output projections), positions are rotary (no position table), so the logits at a
    position are the head of the normalised embedding of its token. Its log-probabilities are then
    a table, `bigram_table`, and any sequence's score a sum over adjacent pairs."""
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=vocab_size,
        context_length=16,
        n_layer=1,
        n_head=2,
        n_embd=16,
        position_embedding="rope",
        zero_init_proj=True,
        tie_weights=False,
    )
    model = GPT(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # peaked distributions, so that the answers differ clearly
    return model


def bigram_table(model: GPT, previous: list[int]) -> dict[int, torch.Tensor]:
    """log p(next | previous token) for each of `previous`: one forward pass of that one token."""
    with torch.no_grad():
        rows = torch.log_softmax(model(torch.tensor([[p] for p in previous])).double()[:, 0], dim=-1)
    return dict(zip(previous, rows, strict=True))
