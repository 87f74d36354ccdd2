"""The play_speakers and play_next_line tasks end to end on a stand-in corpus: a base model scored
on the plain text, a model fine-tuned on conversations through the chat template, each as computed
by hand from the ids it reads; the chat prompt and answer are the very ids fine-tuning trains on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install -e '.[eval]')")

import minigpt.evaluation  # noqa: E402
from minigpt.checkpoints import save_safetensors  # noqa: E402
from minigpt.cli.evaluate import evaluate_main  # noqa: E402
from minigpt.data import CharTokenizer, Tokenizer  # noqa: E402
from minigpt.data.chat.instructions import instruction_messages  # noqa: E402
from minigpt.data.chat.template import ChatEncoder  # noqa: E402
from minigpt.data.questions import make as questions  # noqa: E402
from minigpt.data.tokenizer import ChatTokenizer, with_chat_tokens  # noqa: E402
from minigpt.evaluation.harness import MiniGPTLM  # noqa: E402
from minigpt.evaluation.lm_eval import run_tasks  # noqa: E402
from minigpt.model import GPT, GPTConfig  # noqa: E402

from ..data.plays import synthetic_corpus  # noqa: E402

TASKS = str(Path(minigpt.evaluation.__file__).parent / "tasks")
LIMIT = 8


@pytest.fixture(scope="module")
def test_rows(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    corpus = tmp_path_factory.mktemp("corpus") / "plays.txt"
    corpus.write_text(synthetic_corpus(), encoding="utf-8")
    return corpus, questions.question_splits(corpus.read_text(encoding="utf-8"))["test"]


@pytest.fixture
def stand_in_corpus(test_rows, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The tasks read the stand-in corpus; its test rows of every kind."""
    corpus, rows = test_rows
    monkeypatch.setattr(questions, "shakespeare_path", lambda: corpus)
    return rows


@pytest.fixture
def stand_in(stand_in_corpus: list[dict]) -> list[dict]:
    """The play_speakers task's test rows on the stand-in corpus."""
    return [row for row in stand_in_corpus if row["kind"] == "speaker"]


def model_for(tokenizer: Tokenizer) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.n_vocab, context_length=256, n_layer=1, n_head=2, n_embd=16)
    model = GPT(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # answers far apart, so no tie decides a question
    return model


def char_tokenizer(rows: list[dict]) -> CharTokenizer:
    return CharTokenizer.from_texts([row["instruction"] + " " + " ".join(row["choices"]) for row in rows])


@torch.no_grad()
def log_likelihood(model: GPT, context: list[int], continuation: list[int]) -> float:
    ids = torch.tensor([context + continuation])
    logprobs = torch.log_softmax(model(ids[:, :-1]).double(), dim=-1)[0]  # (T - 1, V)
    return sum(float(logprobs[len(context) - 1 + i, c]) for i, c in enumerate(continuation))


def accuracy(model: GPT, tokenizer: Tokenizer, rows: list[dict]) -> float:
    """How often the answer is the likeliest choice: after the plain question and a space, or for
    a model with chat markers, as the assistant's reply to the question."""
    right = 0
    for row in rows:
        if isinstance(tokenizer, ChatTokenizer):
            context = ChatEncoder(tokenizer).prompt_ids(instruction_messages(row, "row")[:1])
            replies = [tokenizer.encode(choice) for choice in row["choices"]]
        else:
            context = tokenizer.encode(row["instruction"])
            replies = [tokenizer.encode(" " + choice) for choice in row["choices"]]
        scores = [log_likelihood(model, context, reply) for reply in replies]
        right += scores.index(max(scores)) == row["label"]
    return right / len(rows)


def test_a_base_model_is_scored_on_the_plain_question(stand_in: list[dict]) -> None:
    tokenizer = char_tokenizer(stand_in)
    model = model_for(tokenizer)
    rows, result = run_tasks(model, tokenizer, ["play_speakers"], TASKS, limit=LIMIT, bootstrap_iters=0)
    acc = {row.metric: row for row in rows}["acc"]
    assert acc.n == LIMIT and acc.value == pytest.approx(accuracy(model, tokenizer, stand_in[:LIMIT]))
    assert result["configs"]["play_speakers"]["test_split"] == "test"


def test_a_next_line_is_chosen_by_its_likelihood_and_by_its_likelihood_per_character(
    stand_in_corpus: list[dict],
) -> None:
    # acc: the likeliest line after the plain question and a space; acc_norm: lm-eval divides each
    # line's log-likelihood (the space's included) by the line's length in characters.
    limit = 64  # enough questions for the two to differ
    asked = [row for row in stand_in_corpus if row["kind"] == "next_line"][:limit]
    tokenizer = char_tokenizer(stand_in_corpus)
    model = model_for(tokenizer)
    rows, result = run_tasks(model, tokenizer, ["play_next_line"], TASKS, limit=limit, bootstrap_iters=0)
    right = {"acc": 0, "acc_norm": 0}
    for row in asked:
        context = tokenizer.encode(row["instruction"])
        scores = [log_likelihood(model, context, tokenizer.encode(" " + line)) for line in row["choices"]]
        per_character = [score / len(line) for score, line in zip(scores, row["choices"], strict=True)]
        right["acc"] += scores.index(max(scores)) == row["label"]
        right["acc_norm"] += per_character.index(max(per_character)) == row["label"]
    scored = {row.metric: row for row in rows}
    assert {metric: scored[metric].value for metric in right} == pytest.approx(
        {metric: count / limit for metric, count in right.items()}
    )
    assert right["acc"] != right["acc_norm"] and scored["acc"].n == limit
    assert result["configs"]["play_next_line"]["test_split"] == "test"


def test_a_chat_model_reads_the_question_as_fine_tuning_wrote_it(
    stand_in: list[dict], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    tokenizer = with_chat_tokens(char_tokenizer(stand_in))
    model = model_for(tokenizer)
    # The prompt and reply scored are the ids fine-tuning trains on, the end marker aside.
    row = stand_in[0]
    lm = MiniGPTLM(model, tokenizer)
    context, reply = lm._encode_pair(
        lm.apply_chat_template(instruction_messages(row, "row")[:1]), row["output"]
    )
    ids, learned = ChatEncoder(tokenizer).encode(instruction_messages(row, "row"))
    assert context + reply + [tokenizer.end_id] == ids.tolist()
    assert learned.tolist() == [False] * len(context) + [True] * (len(reply) + 1)
    assert tokenizer.ids["user"] in context and tokenizer.ids["assistant"] == context[-1]
    # evaluate.py prompts such a model through the chat template without being told.
    path = tmp_path / "chat.safetensors"
    save_safetensors(model, tokenizer, path)
    args = ["--checkpoint", str(path), "--tasks", "play_speakers", "--include_path", TASKS]
    assert evaluate_main([*args, "--limit", str(LIMIT), "--bootstrap_iters", "0"]) == 0
    capsys.readouterr()
    document = json.loads(path.with_name("chat.safetensors.evaluation.json").read_text())
    assert document["settings"]["tasks"]["apply_chat_template"] is True
    acc = {r["metric"]: r for r in document["results"]}["acc"]
    assert acc["n"] == LIMIT and acc["value"] == pytest.approx(accuracy(model, tokenizer, stand_in[:LIMIT]))


def test_a_marker_typed_in_a_question_stays_text(stand_in: list[dict]) -> None:
    base = CharTokenizer.from_texts([stand_in[0]["instruction"], "<|user|>"])
    tokenizer = with_chat_tokens(base)
    lm = MiniGPTLM(model_for(tokenizer), tokenizer)
    message = [{"role": "user", "content": "Who says <|user|>?"}]
    context, _ = lm._encode_pair(lm.apply_chat_template(message), "ANNA")
    assert context.count(tokenizer.ids["user"]) == 1
    assert context == ChatEncoder(tokenizer).prompt_ids(message)
