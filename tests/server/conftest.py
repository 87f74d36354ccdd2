"""A tiny random model behind a real server on a loopback port, shared by the server's tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import torch

from minigpt.checkpoints import load_model, save_safetensors
from minigpt.cli.serve import ServeOptions, build_server
from minigpt.data import CharTokenizer, Tokenizer
from minigpt.model import GPT, GPTConfig

CHARS = "\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CONFIG = GPTConfig(vocab_size=len(CHARS), context_length=64, n_layer=2, n_head=2, n_embd=16)
NAME = "tiny"
LIMITS = dict(max_tokens=48, max_n=3, max_logprobs=5, max_running=2, max_waiting=6)
"""The server's limits in these tests: small, so that the load test meets them."""


@dataclass
class Served:
    url: str
    model: GPT
    tokenizer: Tokenizer
    server: object

    def client(self, **options: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", **options)


@pytest.fixture(scope="session")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer model over characters; its weights scaled up so its choices are not uniform."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT(CONFIG)
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(8.0)
    return save_safetensors(
        model, CharTokenizer(CHARS), tmp_path_factory.mktemp("served") / f"{NAME}.safetensors"
    )


@pytest.fixture(scope="session")
def served(model_file: Path) -> Iterator[Served]:
    """The server of `serve.py` for `model_file`, running in this process on a free loopback port."""
    opts = ServeOptions(checkpoint=str(model_file), port=0, access_log=False, device="cpu", **LIMITS)
    server, sock = build_server(opts)
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the server did not start"
    model, tokenizer = load_model(model_file)
    host, port = sock.getsockname()[:2]
    yield Served(f"http://{host}:{port}", model, tokenizer, server)
    server.should_exit = True
    thread.join(timeout=10)
