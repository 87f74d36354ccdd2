"""Tiny models behind a real server on a loopback port, shared by the server's tests: a random base
model, and one fine-tuned on conversations."""

from __future__ import annotations

import json
import string
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
CHAT_NAME = "tiny-chat"
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
    with serving(model_file, NAME) as server:
        yield server


@pytest.fixture(scope="session")
def chat_model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model fine-tuned by `train.py --config sft.yaml` on chats that answer a word with it
    in capitals ("hi" -> "HI!"): 60 steps, a few seconds, enough to end its turns with the end
    marker, if not always with the right word."""
    from minigpt.cli.train import train_main  # Lightning: imported by the tests that train only

    from ..training.helpers import sft_args

    folder = tmp_path_factory.mktemp("sft")
    base = CharTokenizer.from_texts([string.printable])
    config = GPTConfig(vocab_size=base.n_vocab, context_length=64, n_layer=2, n_head=2, n_embd=32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        save_safetensors(GPT(config), base, folder / "base.safetensors")
    chats = []
    for word in ["hi", "yes", "no", "ok", "bye", "up", "on", "go"]:
        for system in ([], [{"role": "system", "content": "Echo."}]):
            turns = [{"role": "user", "content": word}, {"role": "assistant", "content": f"{word.upper()}!"}]
            chats.append({"messages": system + turns})
    (folder / "chats.jsonl").write_text("".join(json.dumps(chat) + "\n" for chat in chats * 2))
    files = (folder / "base.safetensors", folder / "chats.jsonl")
    steps = ["--trainer.max_steps", "60", "--trainer.val_check_interval", "60"]
    batches = ["--data.conversations.batch_size", "4"]  # the 32 chats pack into 6 windows
    fast = ["--model.optim.lr", "1e-2", "--model.optim.warmup_steps", "0", *steps, *batches]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setenv("WANDB_MODE", "disabled")
        assert train_main(sft_args(files, folder / "run", *fast)) == 0
    return folder / "run" / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="session")
def chat_served(chat_model_file: Path) -> Iterator[Served]:
    """The server for the fine-tuned `chat_model_file`."""
    with serving(chat_model_file, CHAT_NAME) as server:
        yield server


@contextmanager
def serving(checkpoint: Path, name: str) -> Iterator[Served]:
    """The server of `serve.py` for `checkpoint`, running in this process on a free loopback port."""
    opts = ServeOptions(
        checkpoint=str(checkpoint), model_name=name, port=0, access_log=False, device="cpu", **LIMITS
    )
    server, sock = build_server(opts)
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the server did not start"
    model, tokenizer = load_model(checkpoint)
    host, port = sock.getsockname()[:2]
    try:
        yield Served(f"http://{host}:{port}", model, tokenizer, server)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
