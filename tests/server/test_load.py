"""A burst of concurrent streaming clients: each is served in full or refused with 503 at once,
clients that leave mid-stream give their place back, and nothing is left behind."""

from __future__ import annotations

import asyncio
import gc
import json
import resource

import httpx

from minigpt.model import KVCache

from .conftest import LIMITS, NAME, Served

CLIENTS = 50
TOKENS = 12


async def one_client(client: httpx.AsyncClient, leave_early: bool) -> str:
    """'refused', 'left', or the text served in full; anything else fails the test."""
    body = dict(model=NAME, prompt="ROMEO:\n", max_tokens=TOKENS, stream=True, seed=1)
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code == 503:
            error = json.loads(await response.aread())["error"]
            assert error["type"] == "server_overloaded" and "busy" in error["message"], error
            return "refused"
        assert response.status_code == 200, await response.aread()
        text, done = "", False
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                text += json.loads(line[6:])["choices"][0]["text"]
                if leave_early:
                    return "left"  # closes the connection in mid-stream
        assert done and len(text) == TOKENS, text
        return text


async def burst(url: str) -> list[str]:
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        return await asyncio.gather(*(one_client(client, leave_early=i % 5 == 4) for i in range(CLIENTS)))


async def settled(url: str) -> dict:
    """The server's health once no request is running or waiting (the places came back)."""
    async with httpx.AsyncClient(base_url=url) as client:
        for _ in range(200):
            health = (await client.get("/health")).json()
            if health["running"] == health["waiting"] == 0:
                return health
            await asyncio.sleep(0.02)
    raise AssertionError(f"requests still held after the burst: {health}")


def test_fifty_concurrent_streams_are_served_or_refused_and_leave_nothing_behind(served: Served) -> None:
    places = LIMITS["max_running"] + LIMITS["max_waiting"]
    peaks = []
    for _ in range(2):
        outcomes = asyncio.run(burst(served.url))
        asyncio.run(settled(served.url))
        texts = [o for o in outcomes if o not in ("left", "refused")]
        assert outcomes.count("refused") > 0, "a burst larger than the queue was admitted whole"
        assert len(texts) + outcomes.count("left") >= places
        # One seed, one text: requests taking turns on the model never draw from each other's generator.
        assert len(set(texts)) == 1, texts
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is KVCache], "a request's KV cache outlived it"
    assert peaks[-1] - peaks[0] < 20 * 1024, f"peak memory grew from burst to burst: {peaks} KiB"
    # Still serving after the bursts.
    assert (
        httpx.post(
            f"{served.url}/v1/completions", json=dict(model=NAME, prompt="A", max_tokens=2)
        ).status_code
        == 200
    )
