"""`serve.py`: an OpenAI-compatible API and a web page for a trained model, served by uvicorn."""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from minigpt.common import UsageError

from .command import USER_ERRORS, options_parser, parse_options, report

API_KEY_ENV = "MINIGPT_API_KEY"
"""The environment variable that holds the API key, as an alternative to --api_key."""


@dataclass(frozen=True)
class ServeOptions:
    """Which model to serve, where, and how much one request and the queue may hold."""

    checkpoint: str
    """A run folder (its best checkpoint), a .ckpt or exported .safetensors file, or a GPT-2
    folder in the Hugging Face layout (config.json + weights; a hub name such as gpt2 is fetched)."""
    host: str = "127.0.0.1"
    """Address to listen on. The default answers this machine only; 0.0.0.0 answers anyone who
    can reach it (set --api_key then)."""
    port: int = 8000
    """Port to listen on (0: any free port, printed at start)."""
    model_name: str | None = None
    """The model's name in the API (`model` in requests, /v1/models); default: the run folder's
    or file's name."""
    max_tokens: int = 256
    """The most tokens one request may generate per choice (more is answered 400); also what a
    chat request without max_tokens gets."""
    max_n: int = 4
    """The most choices (n) one request may ask for."""
    max_logprobs: int = 20
    """The most alternatives per token one request may ask for (logprobs, top_logprobs)."""
    max_running: int = 4
    """Requests generating at once; they take turns on the model, one token at a time."""
    max_waiting: int = 32
    """Requests waiting for a turn; when all these places are taken, more are answered 503."""
    chat_template: str | None = None
    """A Jinja chat template file that turns messages into the prompt (default: the one in
    data/chat/chat_template.jinja, which writes each message as "ROLE:" and its text for a base model,
    and between the role's markers for a model fine-tuned on conversations)."""
    chat_stop: list[str] = field(default_factory=lambda: ["\n\n"])
    """Strings that end a base model's turn in chat answers, besides the request's own stop (a model
    fine-tuned on conversations ends its turn with the end marker instead)."""
    api_key: str | None = None
    """Require this key (Authorization: Bearer <key>) on the API; also read from $MINIGPT_API_KEY."""
    access_log: bool = True
    """Log one line per request."""
    device: str = "auto"
    """cpu, cuda, cuda:1, ... (auto: cuda when available)."""
    tokenizer_path: str | None = None
    """GPT-2's r50k_base.tiktoken ranks file, on machines that cannot fetch it."""

    def __post_init__(self) -> None:
        for name in ("max_tokens", "max_n", "max_running"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_logprobs", "max_waiting"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.port <= 65535:
            raise UsageError(f"port must be in [0, 65535], got {self.port}")


def serve_main(args: Sequence[str] | None = None) -> int:
    """Parse the command line, load the model, serve until Ctrl-C (exit 0). Returns the exit code."""
    parser = options_parser(
        "serve.py",
        "Serve a trained minigpt model: an OpenAI-compatible API and a web page that shows generation.",
        ServeOptions,
    )
    try:
        (opts,) = parse_options(parser, args, ServeOptions)
        server, sock = build_server(opts)
    except USER_ERRORS as err:
        return report(err)
    except ImportError as err:
        return report(UsageError(f"serving needs the serve extra: pip install -e '.[serve]' ({err})"))
    except OSError as err:
        return report(UsageError(f"cannot listen on {opts.host}:{opts.port}: {err.strerror or err}"))
    host, port = sock.getsockname()[:2]
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
    print(f"serving {server.config.app.state.engine.name} at {url}/ (API: {url}/v1)", file=sys.stderr)
    if not ipaddress.ip_address(host).is_loopback:
        key = "" if server.config.app.state.api_key else "; no --api_key is set"
        print(f"warning: {host} answers other machines too{key}", file=sys.stderr)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn stops gracefully on Ctrl-C, then raises it again
        pass
    return 0


def build_server(opts: ServeOptions):  # -> tuple[uvicorn.Server, socket.socket]
    """The uvicorn server for `opts`, with its listening socket bound (so port 0 is resolved)."""
    import uvicorn

    from minigpt.checkpoints import load_model
    from minigpt.model import optimize_for_decoding
    from minigpt.server import ChatTemplate, Engine, Limits, create_app

    chat = ChatTemplate.load(opts.chat_template, tuple(opts.chat_stop))
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(opts.host).version == 6 else socket.AF_INET
    except ValueError:
        raise UsageError(
            f"host must be an IP address such as 127.0.0.1 or 0.0.0.0, got {opts.host!r}"
        ) from None
    device = ("cuda" if torch.cuda.is_available() else "cpu") if opts.device == "auto" else opts.device
    model, tokenizer = load_model(opts.checkpoint, device=device, tokenizer_path=opts.tokenizer_path)
    if device == "cpu":
        optimize_for_decoding(model)
    limits = Limits(
        max_tokens=opts.max_tokens,
        max_n=opts.max_n,
        max_logprobs=opts.max_logprobs,
        max_running=opts.max_running,
        max_waiting=opts.max_waiting,
    )
    engine = Engine(model, tokenizer, opts.model_name or default_name(opts.checkpoint), limits)
    api_key = opts.api_key or os.environ.get(API_KEY_ENV) or None
    app = create_app(engine, chat, api_key=api_key)
    app.state.engine, app.state.api_key = engine, api_key
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((opts.host, opts.port))
        sock.listen(2048)  # connections queue from now on, while the server starts; uvicorn's backlog
    except OSError:
        sock.close()
        raise
    config = uvicorn.Config(app, log_level="info", access_log=opts.access_log, timeout_graceful_shutdown=5)
    return uvicorn.Server(config), sock


def default_name(checkpoint: str) -> str:
    """A model's name from its path: the run folder's or file's name ("runs/small" -> "small")."""
    path = os.path.normpath(checkpoint)
    name = os.path.basename(path)
    if name in ("best.ckpt", "last.ckpt") and os.path.basename(os.path.dirname(path)) == "checkpoints":
        name = os.path.basename(os.path.dirname(os.path.dirname(path)))
    return os.path.splitext(name)[0] or "minigpt"
