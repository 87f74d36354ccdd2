"""Reading a run's saved settings (the `config.yaml` train.py writes beside its CSV log)."""

from __future__ import annotations

from typing import Any


def data_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a run's data module, from its config.yaml as a dict.

    train.py lets a config name its data module, so the file holds `data:` as `class_path` and
    `init_args`; a run saved before that holds the module's settings directly under `data:`. Both
    give the same dict here, e.g. `{"config": {"source": ..., "batch_size": ...}}` for text data.
    """
    data = config.get("data") or {}
    if isinstance(data, dict) and "class_path" in data:
        return data.get("init_args") or {}
    return data if isinstance(data, dict) else {}
