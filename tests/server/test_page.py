"""The web page in headless Chromium, as a reader uses it: type a prompt, watch the tokens come,
hover one to see the alternatives the model weighed and what it attended to."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ..training.test_train_generate import CHROMIUM
from .conftest import NAME, Served

playwright = pytest.importorskip(
    "playwright.sync_api", reason="the page test drives Chromium with playwright"
)

PROMPT = "ROMEO:\n"
TOKENS, SEED, HOVERED = 16, 4, 5


@pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on PATH to open the page in (Debian: apt-get install chromium)"
)
def test_the_page_streams_tokens_and_shows_alternatives_and_attention(served: Served, tmp_path: Path) -> None:
    api = served.client().completions.create(
        model=NAME, prompt=PROMPT, max_tokens=TOKENS, temperature=0.8, seed=SEED, logprobs=5
    )
    outside: list[str] = []
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)

        def only_the_server(route: playwright.Route) -> None:  # the page must need nothing else
            if route.request.url.startswith(served.url):
                route.continue_()
            else:
                outside.append(route.request.url)
                route.abort()

        page.route("**/*", only_the_server)
        page.goto(served.url)
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
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
        browser.close()
    assert not errors and not outside, (errors, outside)
    assert (tmp_path / "page.png").stat().st_size > 20_000


def chip_weights(page: object) -> list[float]:
    return [
        float(w) for w in page.locator("#attention .chip").evaluate_all("cs => cs.map(c => c.dataset.weight)")
    ]
