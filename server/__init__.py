"""Serving a trained model: an OpenAI-compatible HTTP API and a web page that shows generation.

`Engine` runs the project's own generation (`minigpt.model.generate_steps`: the KV cache and the
samplers) and attention weights (`GPT.attention_weights`, as the pictures draw them) on one
worker thread; `create_app` puts them behind FastAPI. `serve.py` starts it with uvicorn.
"""

from .app import create_app
from .chat import DEFAULT_STOP, DEFAULT_TEMPLATE, ChatTemplate
from .engine import Engine, Limits

__all__ = ["DEFAULT_STOP", "DEFAULT_TEMPLATE", "ChatTemplate", "Engine", "Limits", "create_app"]
