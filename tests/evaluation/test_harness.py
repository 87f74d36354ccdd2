"""Our model behind lm-eval's LM interface: scores checked by hand on a model whose log-probabilities
form a table, and the same scores as lm-eval's own `hf` model for a GPT-2 exported to transformers."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import tiktoken

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install -e '.[eval]')")

from lm_eval.api.instance import Instance  # noqa: E402

from minigpt.data import DataError, GPT2Tokenizer  # noqa: E402
from minigpt.evaluation.harness import MiniGPTLM  # noqa: E402
from minigpt.evaluation.lm_eval import run_tasks  # noqa: E402

from .conftest import CHOICES, TEXTS, bigram_model, bigram_table  # noqa: E402


def by_task(rows) -> dict[tuple[str, str], float]:
    return {(r.task, r.metric): r.value for r in rows}


@pytest.fixture(scope="module")
def bigram(gpt2_encoding: tiktoken.Encoding):
    tokenizer = GPT2Tokenizer(gpt2_encoding)
    return bigram_model(tokenizer.n_vocab), tokenizer


def test_a_continuation_after_a_trailing_space_is_scored_as_one_token(bigram) -> None:
    # The classic off-by-one: "... is " + "Paris" must be scored as GPT-2 reads "... is Paris":
    # " Paris" after " is", not "Paris" after a lone " ". Likewise for an empty context: the
    # continuation's first token is predicted from end-of-text.
    model, tokenizer = bigram
    lm = MiniGPTLM(model, tokenizer, batch_size=2)
    (is_,), (paris,), (space,), (bare,) = (tokenizer.encode(s) for s in (" is", " Paris", " ", "Paris"))
    it = tokenizer.encode("It")[0]
    table = bigram_table(model, [is_, space, tokenizer.eot_id, it])
    requests = [
        Instance("loglikelihood", {}, ("The capital of France is ", "Paris"), 0),
        Instance("loglikelihood", {}, ("", "It is"), 0),
    ]
    (after_space, greedy), (from_nothing, _) = lm.loglikelihood(requests)
    assert after_space == pytest.approx(float(table[is_][paris]), rel=1e-6)
    assert abs(after_space - float(table[is_][space] + table[space][bare])) > 0.1  # the wrong reading
    assert greedy == (int(table[is_].argmax()) == paris)
    assert from_nothing == pytest.approx(float(table[tokenizer.eot_id][it] + table[it][is_]), rel=1e-6)


def test_multiple_choice_and_rolling_tasks_score_as_computed_by_hand(bigram, tasks: Path) -> None:
    model, tokenizer = bigram
    rows, _ = run_tasks(
        model, tokenizer, ["mini_choice", "mini_text"], str(tasks), batch_size=3, bootstrap_iters=0
    )
    got = by_task(rows)
    # Multiple choice: each answer is one token after the question's last; acc picks the most
    # likely, acc_norm the most likely per byte of the answer (lm-eval counts the answer's characters).
    last = [tokenizer.encode(doc["question"])[-1] for doc in CHOICES]
    table = bigram_table(model, sorted(set(last)))
    acc, acc_norm = [], []
    for doc, previous in zip(CHOICES, last, strict=True):
        answers = [tokenizer.encode(" " + choice) for choice in doc["choices"]]
        assert all(len(a) == 1 for a in answers)
        scores = [float(table[previous][a[0]]) for a in answers]
        normed = [s / len(" " + c) for s, c in zip(scores, doc["choices"], strict=True)]
        acc.append(scores.index(max(scores)) == doc["label"])
        acc_norm.append(normed.index(max(normed)) == doc["label"])
    assert got["mini_choice", "acc"] == pytest.approx(sum(acc) / len(acc))
    assert got["mini_choice", "acc_norm"] == pytest.approx(sum(acc_norm) / len(acc_norm))
    # Rolling: the first token after end-of-text, every other after the one before it, over windows
    # of the 16-token context; the texts are longer, so a token scored twice or missed shows.
    total, words, nbytes = 0.0, 0, 0
    for doc in TEXTS:
        ids = [tokenizer.eot_id, *tokenizer.encode(doc["text"])]
        assert len(ids) > model.config.context_length + 1
        table = bigram_table(model, sorted(set(ids[:-1])))
        total += sum(float(table[a][b]) for a, b in zip(ids, ids[1:], strict=False))
        words += len(re.split(r"\s+", doc["text"]))
        nbytes += len(doc["text"].encode("utf-8"))
    assert got["mini_text", "word_perplexity"] == pytest.approx(math.exp(-total / words), rel=1e-5)
    assert got["mini_text", "byte_perplexity"] == pytest.approx(math.exp(-total / nbytes), rel=1e-5)
    assert got["mini_text", "bits_per_byte"] == pytest.approx(-total / nbytes / math.log(2), rel=1e-5)


def test_our_lm_scores_an_exported_gpt2_as_lm_evals_hf_model_does(
    gpt2_encoding, tasks: Path, tmp_path
) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    import torch
    from lm_eval.models.huggingface import HFLM

    from minigpt.checkpoints import save_huggingface
    from minigpt.evaluation.lm_eval import evaluate_lm, load_tasks, scores, task_manager
    from minigpt.model import GPT, GPTConfig

    tokenizer = GPT2Tokenizer(gpt2_encoding)
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=tokenizer.n_vocab,
        context_length=16,
        n_layer=2,
        n_head=2,
        n_embd=32,
        qkv_bias=True,
        gelu_approximate="tanh",
    )
    model = GPT(config).eval()
    with torch.no_grad():  # larger weights than GPT-2's initialisation, so the answers differ by model
        for p in model.parameters():
            p.mul_(8.0 if p.ndim == 2 else 1.0)
    save_huggingface(model, tokenizer, tmp_path / "gpt2")
    names = ["mini_choice", "mini_text"]  # generation is compared request by request below
    ours, _ = run_tasks(model, tokenizer, names, str(tasks), batch_size=3, bootstrap_iters=0)
    # lm-eval's own model for transformers, one sequence at a time (its batches pad on the left).
    hf = HFLM(pretrained=str(tmp_path / "gpt2"), batch_size=1, device="cpu", dtype="float32")
    theirs = evaluate_lm(hf, load_tasks(task_manager(names, str(tasks)), names), bootstrap_iters=0)
    expected = by_task(scores(theirs))
    assert set(by_task(ours)) == set(expected)
    for key, value in by_task(ours).items():
        assert value == pytest.approx(expected[key], rel=1e-5), key
    # The same log-likelihoods request by request, a context longer than the model's included
    # (cropped from the left), and the same greedy continuations.
    lm = MiniGPTLM(model, tokenizer, batch_size=3)
    pairs = [(doc["question"] + " ", choice) for doc in CHOICES for choice in doc["choices"]]
    pairs.append((TEXTS[0]["text"], " And so it goes."))
    requests = [Instance("loglikelihood", {}, pair, 0) for pair in pairs]
    for mine, hf_answer in zip(lm.loglikelihood(requests), hf.loglikelihood(requests), strict=True):
        assert mine[0] == pytest.approx(hf_answer[0], rel=1e-5) and mine[1] == hf_answer[1]
    settings = {"until": ["\n\n"], "max_gen_toks": 5, "do_sample": False}
    prompts = [Instance("generate_until", {}, (doc["question"], dict(settings)), 0) for doc in CHOICES]
    generated = lm.generate_until(prompts)
    assert generated == hf.generate_until(prompts) and all(generated)


def test_a_char_model_without_end_of_text_conditions_on_a_line_break() -> None:
    from minigpt.data import CharTokenizer

    tokenizer = CharTokenizer("\n abc")
    model = bigram_model(tokenizer.n_vocab)
    lm = MiniGPTLM(model, tokenizer)
    assert lm.prefix_token_id == tokenizer.encode("\n")[0]
    with pytest.raises(DataError, match="'z'"):
        lm.loglikelihood([Instance("loglikelihood", {}, ("ab", "z"), 0)])


def test_a_chat_prompt_is_continued_until_the_end_of_the_assistants_turn() -> None:
    import torch

    from minigpt.data import CharTokenizer
    from minigpt.data.chat.template import ChatEncoder
    from minigpt.data.tokenizer import with_chat_tokens

    tokenizer = with_chat_tokens(CharTokenizer.from_texts(["Who are you?\n"]))
    model = bigram_model(tokenizer.n_vocab)
    with torch.no_grad():  # every position sees one vector (of zero mean, which normalising keeps)
        wte = model.transformer.wte.weight
        wte.copy_(torch.tensor([1.0, -1.0]).repeat(wte.shape[1] // 2))
        model.lm_head.weight.zero_()
        model.lm_head.weight[tokenizer.end_id] = wte[0]  # and the end marker is its likeliest next id
    lm = MiniGPTLM(model, tokenizer)
    message = [{"role": "user", "content": "Who are you?"}]
    prompt = lm.apply_chat_template(message)
    assert lm._encode_pair(prompt, "")[0] == ChatEncoder(tokenizer).prompt_ids(message)
    settings = {"until": ["\n\n"], "max_gen_toks": 4, "do_sample": False}
    # The reply ends at its first id, the end marker; after a plain prompt the marker is text.
    assert lm.generate_until([Instance("generate_until", {}, (prompt, dict(settings)), 0)]) == [""]
    plain = lm.generate_until([Instance("generate_until", {}, ("Who are you?", dict(settings)), 0)])
    assert plain == ["<|end|>" * 4]
