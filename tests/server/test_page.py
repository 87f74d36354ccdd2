"""The web page in headless Chromium, as a reader uses it: type a prompt, watch the tokens come,
hover one to see the alternatives the model weighed and what it attended to; or chat with a model
fine-tuned on conversations."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
import torch

from ..training.helpers import CHROMIUM
from .conftest import CHAT_NAME, NAME, Served

playwright = pytest.importorskip(
    "playwright.sync_api", reason="the page test drives Chromium with playwright"
)

PROMPT = "ROMEO:\n"
TOKENS, SEED, HOVERED = 16, 4, 5
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on PATH to open the page in (Debian: apt-get install chromium)"
)


@contextmanager
def browsing(served: Served, refused: int = 0) -> Iterator[playwright.Page]:
    """The page in headless Chromium, ready; it must need nothing but the server and show no error
    but the `refused` requests the server answers with a 4xx (Chromium logs each as an error)."""
    errors: list[str] = []
    outside: list[str] = []
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)

        def only_the_server(route: playwright.Route) -> None:
            if route.request.url.startswith(served.url):
                route.continue_()
            else:
                outside.append(route.request.url)
                route.abort()

        page.route("**/*", only_the_server)
        page.goto(served.url)
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        yield page
        browser.close()
    refusals = [e for e in errors if "the server responded with a status of 4" in e]
    assert len(refusals) == refused and len(errors) == refused and not outside, (errors, outside)


@needs_chromium
def test_the_page_streams_tokens_and_shows_alternatives_and_attention(served: Served, tmp_path: Path) -> None:
    api = served.client().completions.create(
        model=NAME, prompt=PROMPT, max_tokens=TOKENS, temperature=0.8, seed=SEED, logprobs=5
    )
    with browsing(served) as page:
        page.fill("#prompt", PROMPT)
        page.fill("#max_tokens", str(TOKENS))
        page.fill("#temperature", "0.8")
        page.fill("#seed", str(SEED))
        page.click("#go")
        page.wait_for_function("document.getElementById('status').textContent.includes('token limit')")
        shown = page.inner_text("#output").replace("⏎\n", "\n")
        assert page.locator("#output .tok").count() == TOKENS
        assert shown == PROMPT + api.choices[0].text  # the tokens the API gives for this seed

        page.hover(f"#output .tok >> nth={HOVERED}")
        page.wait_for_selector("#attention .chip")
        assert page.inner_text("#chosen").startswith(f"Step {HOVERED + 1}:")
        rows = page.locator("#alternatives tr")
        expected = api.choices[0].logprobs.top_logprobs[HOVERED]
        assert rows.count() == len(expected)
        for row, logprob in zip(rows.all(), expected.values(), strict=True):
            assert float(row.locator("td.p").inner_text().strip("%<")) == pytest.approx(
                100 * math.exp(logprob), abs=0.6
            )

        # The attention of the position that chose the token, over the tokens before it.
        ids = served.tokenizer.encode(PROMPT + api.choices[0].text)[: len(PROMPT) + HOVERED]
        weights = served.model.attention_weights(torch.tensor([ids]))
        assert chip_weights(page) == pytest.approx(weights[-1][0, :, -1].mean(0).tolist(), abs=1e-4)
        page.click("#layers button >> text='layer 0'")
        page.click("#heads button >> text='head 1'")
        page.wait_for_function("document.querySelector('#heads button.on').textContent === 'head 1'")
        assert chip_weights(page) == pytest.approx(weights[0][0, 1, -1].tolist(), abs=1e-4)
        page.screenshot(path=tmp_path / "page.png")
    assert (tmp_path / "page.png").stat().st_size > 20_000


@needs_chromium
@pytest.mark.slow  # the model is fine-tuned by train.py first, a few seconds
def test_the_chat_view_streams_the_answers_of_a_conversation(chat_served: Served, tmp_path: Path) -> None:
    """Two turns in the chat view: each answer is the one the API gives for the conversation so far,
    the system message included; reset empties the conversation, and a refused message comes back."""
    client = chat_served.client()
    conversation = [{"role": "system", "content": "Echo."}]
    with browsing(chat_served, refused=1) as page:
        page.click("#tab-chat")
        assert page.is_visible("#chat-view") and not page.is_visible("#tokens-view")
        assert "fine-tuned on conversations" in page.inner_text("#template-note")
        page.fill("#system", "Echo.")
        page.fill("#chat_temperature", "0")
        for turn, word in enumerate(["hi", "go"], start=1):
            page.fill("#chat-input", word)
            page.press("#chat-input", "Enter")
            page.wait_for_function(
                f"document.querySelectorAll('#messages .msg.assistant:not(.pending)').length === {turn}"
            )
            conversation.append({"role": "user", "content": word})
            api = client.chat.completions.create(model=CHAT_NAME, messages=conversation, temperature=0)
            answer = api.choices[0].message.content
            conversation.append({"role": "assistant", "content": answer})
            texts = page.locator("#messages .msg .text").all_inner_texts()
            assert texts == [m["content"] for m in conversation[1:]]
            assert page.inner_text("#status").endswith("the model ended its turn")
        page.screenshot(path=tmp_path / "chat.png")
        page.click("#reset")
        assert page.locator("#messages .msg").count() == 0
        # A message the server refuses goes back to the input, and the status says why.
        page.fill("#chat-input", "too long " * 8)
        page.press("#chat-input", "Enter")
        page.wait_for_selector("#status.error")
        assert "this model's context is 64 tokens" in page.inner_text("#status")
        assert page.input_value("#chat-input") == "too long " * 8
        assert page.locator("#messages .msg").count() == 0
    assert (tmp_path / "chat.png").stat().st_size > 10_000


@needs_chromium
@pytest.mark.slow  # the chat model of the test above
def test_a_conversation_longer_than_the_context_leaves_its_oldest_turns_out(chat_served: Served) -> None:
    """Past the model's 64 tokens, each message leaves out the oldest turns until the prompt fits,
    as chat.py does: each try the server refuses (context_length_exceeded) drops one turn. The
    answers are the API's for what the page sent, and the turns left out are shown faded."""
    client = chat_served.client()
    system = [{"role": "system", "content": "Echo."}]
    conversation: list[dict[str, str]] = []
    first = refusals = 0  # the oldest messages left out; the server's refusals on the way
    words = ["hi", "yes", "no", "ok", "bye", "up", "on", "go"]
    expected = []
    for word in words:  # what the page must do, through the API
        conversation.append({"role": "user", "content": word})
        while True:
            try:
                api = client.chat.completions.create(
                    model=CHAT_NAME, messages=system + conversation[first:], temperature=0
                )
                break
            except openai.BadRequestError as error:
                assert error.code == "context_length_exceeded", error
                first, refusals = first + 2, refusals + 1
        conversation.append({"role": "assistant", "content": api.choices[0].message.content})
        expected.append(first)
    assert first > 0, "the conversation never outgrew the context: the test needs more turns"
    with browsing(chat_served, refused=refusals) as page:
        page.click("#tab-chat")
        page.fill("#system", "Echo.")
        page.fill("#chat_temperature", "0")
        for turn, word in enumerate(words, start=1):
            page.fill("#chat-input", word)
            page.press("#chat-input", "Enter")
            page.wait_for_function(
                f"document.querySelectorAll('#messages .msg.assistant:not(.pending)').length === {turn}"
            )
            dropped = expected[turn - 1]
            if dropped > (expected[turn - 2] if turn > 1 else 0):
                assert page.inner_text("#status").endswith(
                    f"its oldest {dropped // 2} turn(s) are left out"
                ), page.inner_text("#status")
        texts = page.locator("#messages .msg .text").all_inner_texts()
        assert texts == [m["content"] for m in conversation]
        faded = page.locator("#messages .msg").evaluate_all(
            "divs => divs.map(d => d.classList.contains('out'))"
        )
        assert faded == [i < first for i in range(len(conversation))]
        page.click("#reset")  # a new conversation sends everything again
        page.fill("#chat-input", "hi")
        page.press("#chat-input", "Enter")
        page.wait_for_function(
            "document.querySelectorAll('#messages .msg.assistant:not(.pending)').length === 1"
        )
        assert page.locator("#messages .msg.out").count() == 0
        assert page.inner_text("#messages .msg.assistant .text") == conversation[1]["content"]


def chip_weights(page: object) -> list[float]:
    return [
        float(w) for w in page.locator("#attention .chip").evaluate_all("cs => cs.map(c => c.dataset.weight)")
    ]
