"""serve.py's command line: one-line errors before anything listens, and its main serving."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from minigpt.cli import serve as cli_serve
from minigpt.cli.serve import ServeOptions, build_server, default_name, serve_main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoint", "missing.ckpt"], "missing.ckpt"),
        (["--max_tokens", "0"], "max_tokens must be >= 1, got 0"),
        (["--port", "70000"], "port must be in [0, 65535], got 70000"),
        (["--host", "localhost"], "host must be an IP address"),
        (["--chat_template", "nowhere.jinja"], "cannot read the chat template nowhere.jinja"),
    ],
)
def test_bad_options_stop_in_one_line(
    model_file: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert serve_main(["--checkpoint", str(model_file), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_a_broken_template_or_a_taken_port_stop_in_one_line(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m.content }")
    assert serve_main(["--checkpoint", str(model_file), "--chat_template", str(template)]) == 2
    assert "is not a valid Jinja template" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert serve_main(["--checkpoint", str(model_file), "--port", port]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot listen on 127.0.0.1:{port}" in err[0], err


def test_the_model_is_named_after_its_run_or_file() -> None:
    assert default_name("runs/small") == default_name("runs/small/") == "small"
    assert default_name("runs/small/checkpoints/best.ckpt") == "small"
    assert default_name("out/model.safetensors") == "model"


def test_serve_main_says_where_it_serves_and_serves_there(
    model_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """serve.py's main in this process (a new Python process would cost seconds of imports),
    stopped as Ctrl-C stops uvicorn."""
    servers = []

    def build_and_keep(opts: ServeOptions) -> tuple[object, socket.socket]:
        servers.append(build_server(opts))
        return servers[-1]

    monkeypatch.setattr(cli_serve, "build_server", build_and_keep)
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(serve_main(["--checkpoint", str(model_file), "--port", "0"]))
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not (servers and servers[0][0].started) and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        line = capsys.readouterr().err.splitlines()[0]
        found = re.fullmatch(r"serving (\S+) at (http://127\.0\.0\.1:\d+)/ \(API: \2/v1\)", line)
        assert found, line
        client = openai.OpenAI(base_url=f"{found[2]}/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model=found[1], prompt="ROMEO:", max_tokens=5)
        assert found[1] == model_file.stem and len(answer.choices[0].text) == 5
    finally:
        if servers:
            servers[0][0].should_exit = True
        thread.join(timeout=30)
    assert codes == [0]


def test_with_an_api_key_the_api_needs_it_and_the_page_and_health_do_not(
    model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MINIGPT_API_KEY", "sesame")
    server, sock = build_server(ServeOptions(checkpoint=str(model_file), port=0))
    sock.close()
    app = server.config.app

    async def ask() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as client:
            return [
                await client.get("/v1/models"),
                await client.get("/v1/models", headers={"Authorization": "Bearer wrong"}),
                await client.get("/v1/models", headers={"Authorization": "Bearer sesame"}),
                await client.get("/health"),
                await client.get("/"),
            ]

    missing, wrong, right, health, page = asyncio.run(ask())
    assert missing.status_code == wrong.status_code == 401
    assert "API key" in missing.json()["error"]["message"]
    assert right.status_code == health.status_code == page.status_code == 200


def test_the_bearer_scheme_is_read_in_any_case_and_the_key_exactly(
    model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MINIGPT_API_KEY", "Sesame")
    server, sock = build_server(ServeOptions(checkpoint=str(model_file), port=0))
    sock.close()
    accepted = ["Bearer Sesame", "bearer Sesame", "BEARER Sesame", "bEaReR  Sesame"]
    refused = ["Bearer sesame", "Bearer Sesame2", "Sesame", "Basic Sesame", "Bearer", ""]

    async def ask(authorization: str) -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=server.config.app), base_url="http://test"
        ) as client:
            return await client.get("/v1/models", headers={"Authorization": authorization})

    for authorization in accepted:
        assert asyncio.run(ask(authorization)).status_code == 200, authorization
    for authorization in refused:
        answer = asyncio.run(ask(authorization))
        assert answer.status_code == 401 and "API key" in answer.json()["error"]["message"], authorization
