"""The server as a client sees it: OpenAI's own Python client against a running server."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from minigpt.model import generate
from minigpt.server import ChatTemplate

from .conftest import LIMITS, NAME, Served

PROMPT = "ROMEO:\nWhat light"


def project_sample(served: Served, prompt: str, n: int, seed: int, **sampling: object) -> str:
    """What the project's own generation gives for this prompt, seed and settings."""
    ids = torch.tensor([served.tokenizer.encode(prompt)])
    generator = torch.Generator().manual_seed(seed)
    out = generate(served.model, ids, n, generator=generator, **sampling)
    return served.tokenizer.decode(out[0, ids.shape[1] :].tolist())


def test_a_completion_is_the_projects_generation_with_the_same_seed(served: Served) -> None:
    client = served.client()
    answer = client.completions.create(
        model=NAME, prompt=PROMPT, max_tokens=20, temperature=0.8, top_p=0.9, seed=7
    )
    expected = project_sample(served, PROMPT, 20, 7, temperature=0.8, top_p=0.9)
    (choice,) = answer.choices
    assert choice.text == expected and choice.finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(PROMPT), 20)
    assert answer.model == NAME and [m.id for m in client.models.list()] == [NAME]


def test_streams_give_the_same_text_as_whole_answers(served: Served) -> None:
    client = served.client()
    whole = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=16, seed=3).choices[0].text
    chunks = list(
        client.completions.create(
            model=NAME,
            prompt=PROMPT,
            max_tokens=16,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert len(chunks) >= 16 and chunks[-1].usage.completion_tokens == 16

    messages = [{"role": "user", "content": "Who is there?"}]
    chat = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, seed=5)
    stream = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, seed=5, stream=True)
    deltas = [c.choices[0].delta for c in stream]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == chat.choices[0].message.content


def test_chat_is_the_template_rendered_and_continued_until_its_stop(served: Served) -> None:
    messages = [{"role": "system", "content": "Speak."}, {"role": "user", "content": "Who is there?"}]
    answer = served.client().chat.completions.create(model=NAME, messages=messages, max_tokens=40, seed=11)
    prompt = ChatTemplate.load().text.render(messages, add_generation_prompt=True)
    assert prompt == "SYSTEM:\nSpeak.\n\nUSER:\nWho is there?\n\nASSISTANT:\n"
    continuation = project_sample(served, prompt, 40, 11)
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and answer.usage.prompt_tokens == len(prompt)
    assert choice.message.content == continuation.split("\n\n")[0]
    assert choice.finish_reason == ("stop" if "\n\n" in continuation else "length")


def test_stop_strings_end_the_text_before_them_even_across_tokens(served: Served) -> None:
    client = served.client()
    full = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=40, seed=2).choices[0].text
    stop = full[20:23]  # three characters: three tokens, so the text must be held back across steps
    for stream in (False, True):
        answer = client.completions.create(
            model=NAME, prompt=PROMPT, max_tokens=40, seed=2, stop=[stop, "#"], stream=stream
        )
        chunks = list(answer) if stream else [answer]
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == full[: full.index(stop)] and chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs_are_the_models_own_and_n_gives_independent_choices(served: Served) -> None:
    client = served.client()
    answer = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=5)
    ids = torch.tensor([served.tokenizer.encode(PROMPT)])
    expected = torch.log_softmax(served.model(ids)[0, -1].float(), dim=-1).topk(5)
    logprobs = answer.choices[0].logprobs
    first = logprobs.top_logprobs[0]
    assert list(first) == [served.tokenizer.decode([i]) for i in expected.indices.tolist()]
    torch.testing.assert_close(torch.tensor(list(first.values())), expected.values, atol=1e-4, rtol=0)
    assert logprobs.tokens[0] == list(first)[0]  # temperature 0 takes the most likely
    assert logprobs.token_logprobs[0] == pytest.approx(expected.values[0].item(), abs=1e-4)

    chat = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        n=3,
    )
    assert len(chat.choices) == 3 and len({c.message.content for c in chat.choices}) > 1
    for choice in chat.choices:
        assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in choice.logprobs.content)


@pytest.mark.parametrize(
    ("request_", "status", "message"),
    [
        (dict(prompt="ROMEO: " * 10), 400, "the prompt has 70 tokens; this model's context is 64 tokens"),
        (dict(prompt="x", max_tokens=LIMITS["max_tokens"] + 1), 400, "this server generates at most 48"),
        (dict(prompt="x", max_tokens="many"), 400, "max_tokens: Input should be a valid integer"),
        (dict(prompt="x", temperature=-1), 400, "temperature: Input should be greater than or equal to 0"),
        (dict(prompt="x", n=9), 400, "n is 9; this server gives at most 3 choices"),
        (dict(prompt="x", logprobs=50), 400, "at most 5"),
        (dict(prompt="ROMEO#"), 400, "'#' (U+0023)"),
        (dict(prompt=""), 400, "the prompt is empty"),
        (dict(prompt=[5, 999]), 400, "token id 999 is not in the vocabulary"),
        (dict(prompt="x", presence_penalty=0.5), 400, "presence_penalty is not supported"),
        (dict(prompt="x", model="gpt-4"), 404, "the model 'gpt-4' does not exist; this server serves 'tiny'"),
    ],
)
def test_bad_requests_are_answered_with_a_status_and_one_line(
    served: Served, request_: dict, status: int, message: str
) -> None:
    body = dict(model=NAME) | request_
    with pytest.raises(openai.APIStatusError) as caught:
        served.client(max_retries=0).completions.create(**body)
    error = caught.value
    assert error.status_code == status and message in error.message, error.message
    assert error.body["message"] == error.body["message"].strip() and "\n" not in error.body["message"]


def test_malformed_chat_and_bodies_are_400s(served: Served) -> None:
    client = served.client(max_retries=0)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=NAME, messages=[])
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model=NAME, messages=[{"role": "robot", "content": "hi"}])
    answer = httpx.post(
        f"{served.url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]["message"]
    health = httpx.get(f"{served.url}/health").json()
    assert health["status"] == "ok" and health["model"] == NAME and health["context_length"] == 64
