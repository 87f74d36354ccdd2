"""Serve a trained model: `python serve.py --checkpoint runs/small`, then open http://127.0.0.1:8000.

An OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models) and a web page that
shows each token's alternatives and attention; `--help` lists every option.
"""

from __future__ import annotations

from minigpt.cli.serve import serve_main


def main(args: list[str] | None = None) -> int:
    return serve_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
