"""Running lm-evaluation-harness tasks on our model, and the rows of their results.

Only this module and `harness.py` import lm-eval (the `eval` extra); `evaluate.py` and the
`EvaluateTasks` callback import them when tasks are asked for, so training never needs lm-eval.

lm-eval's own tasks read their datasets from the Hugging Face hub. Where it cannot be reached (a
probe of two seconds, `common/hub.py`), the tasks are found without indexing lm-eval's 10,000+
task files and loaded in offline mode: a cached dataset loads at once, a missing one stops in one
line naming it, where the hub client would otherwise retry for half a minute.
"""

from __future__ import annotations

import logging
import re
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minigpt.common import UsageError, hub, one_line
from minigpt.data import DataError, Tokenizer
from minigpt.model import GPT


@dataclass(frozen=True)
class Score:
    """One figure of one task."""

    task: str
    metric: str
    """lm-eval's name, with its filter where that is not `none` (`exact_match,strict-match`)."""
    value: float
    stderr: float | None
    """lm-eval's standard error (closed form, or bootstrapped); None where it gives none."""
    n: int
    """Documents scored."""


def require_lm_eval() -> None:
    """Raise one line naming the extra to install where lm-eval is missing."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise UsageError(
            'tasks need lm-evaluation-harness: pip install -e ".[eval]" (or pip install lm-eval)'
        ) from None


def task_manager(tasks: list[str], include_path: str | None) -> Any:
    """lm-eval's TaskManager that knows `tasks`: the folder `include_path` alone where it holds them
    all (indexing lm-eval's own 10,000+ task files takes seconds), else with lm-eval's tasks too.

    Raises:
        UsageError: A task name matches no task; the line names it.
    """
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    if include_path is not None and not Path(include_path).is_dir():
        raise UsageError(f"include_path {include_path} is not a folder (of lm-eval task YAML files)")
    if include_path is not None:
        local = TaskManager(include_path=include_path, include_defaults=False)
        if all(local.match_tasks([name]) for name in tasks):
            return local
    if hub.hub_unreachable() is not None and (folders := _task_folders(tasks)):
        # Their data must come from the cache: find out in a second whether it is there.
        paths = folders + ([include_path] if include_path is not None else [])
        found = TaskManager(include_path=paths, include_defaults=False)
        if all(name in found.all_subtasks for name in tasks):
            return found
    manager = TaskManager(include_path=include_path)
    unknown = [name for name in tasks if not manager.match_tasks([name])]
    if unknown:
        where = (
            f" in lm-eval or {include_path}"
            if include_path
            else " in lm-eval (local task files: --include_path)"
        )
        raise UsageError(f"unknown task {unknown[0]!r}: no task of that name{where}")
    return manager


def run_tasks(
    model: GPT,
    tokenizer: Tokenizer,
    tasks: list[str],
    include_path: str | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 16,
    bootstrap_iters: int = 100_000,
    seed: int = 1234,
    apply_chat_template: bool | None = None,
) -> tuple[list[Score], dict[str, Any]]:
    """Score `model` on lm-eval `tasks`: the rows, and lm-eval's whole result (configs, versions).
    `apply_chat_template` as :func:`evaluate_lm`.

    Raises:
        UsageError: Unknown task, or lm-eval missing.
        DataError: A task's data cannot be loaded (offline, missing file); the line names the task.
    """
    manager = task_manager(tasks, include_path)
    from .harness import MiniGPTLM

    lm = MiniGPTLM(model, tokenizer, batch_size=batch_size)
    loaded = load_tasks(manager, tasks)
    result = evaluate_lm(lm, loaded, limit, num_fewshot, bootstrap_iters, seed, apply_chat_template)
    return scores(result), result


def load_tasks(manager: Any, tasks: list[str]) -> dict[str, Any]:
    """lm-eval's loaded tasks (their data read or fetched), one at a time so a failure names its task;
    in offline mode where a task's data is on a hub that cannot be reached.

    Raises:
        DataError: A task's data cannot be loaded.
    """
    loaded: dict[str, Any] = {"tasks": {}, "groups": {}, "group_map": {}}
    for name in tasks:
        dataset = _hub_dataset(manager, name)
        unreachable = hub.hub_unreachable() if dataset is not None else None
        try:
            with hub.hub_offline() if unreachable else nullcontext():
                one = manager.load([name])
        except (DataError, UsageError):
            raise
        except Exception as error:
            if unreachable:
                raise DataError(_not_cached(name, dataset, unreachable)) from None
            reason = one_line(error, root_cause=True)
            raise DataError(f"could not load the data of task {name}: {reason}") from None
        for key in loaded:
            loaded[key].update(one.get(key, {}))
    return loaded


def _task_folders(tasks: list[str]) -> list[str]:
    """The folders of lm-eval's own task files that define `tasks` (`task: <name>` at the top
    level), found by reading the files as text: parsing them all, as lm-eval's index does, takes
    seconds. Empty where any task is not found so (a group, a tag)."""
    import lm_eval.tasks

    wanted = "|".join(re.escape(name) for name in tasks)
    line = re.compile(rf"^task:\s*[\"']?({wanted})[\"']?\s*$", re.M)
    folders: dict[str, None] = {}
    seen: set[str] = set()
    for path in sorted(Path(lm_eval.tasks.__file__).parent.glob("**/*.yaml")):
        match = line.search(path.read_text(encoding="utf-8", errors="replace"))
        if match:
            folders[str(path.parent)] = None
            seen.add(match.group(1))
    return list(folders) if seen == set(tasks) else []


def _hub_dataset(manager: Any, name: str) -> str | None:
    """The hub dataset a task reads (`owner/name`, as lm-eval's tasks name theirs): None for local
    data (a file builder such as `json`, a folder); `""` for a group or tag, whose tasks may."""
    entry = manager.task_index.get(name)
    if entry is None or name not in manager.all_subtasks:
        return ""
    path = (entry.cfg or {}).get("dataset_path")
    if not isinstance(path, str) or "/" not in path or Path(path).expanduser().exists():
        return None
    return path


def _not_cached(task: str, dataset: str, reason: str) -> str:
    """One line: what the task needs from the hub, and how to bring it here."""
    import huggingface_hub.constants

    cache = huggingface_hub.constants.HF_HOME
    needs = f"the dataset {dataset}" if dataset else "datasets"
    return (
        f"task {task} reads {needs} from the Hugging Face hub, not in this machine's cache ({cache}), "
        f"and {reason}: where a network is, run this evaluation once (--limit 1 will do), then copy that "
        f"machine's Hugging Face cache (~/.cache/huggingface, or $HF_HOME) to {cache} here"
    )


def evaluate_lm(
    lm: Any,
    loaded: dict[str, Any],
    limit: int | None = None,
    num_fewshot: int | None = None,
    bootstrap_iters: int = 100_000,
    seed: int = 1234,
    apply_chat_template: bool | None = None,
) -> dict[str, Any]:
    """lm-eval's `evaluate` on loaded tasks, set up as its `simple_evaluate` sets them up (few-shot
    count and seed, the random generators), without the environment survey it adds (pip, git and
    GPU probes in subprocesses): our JSON records the versions that matter instead.

    `apply_chat_template`: each prompt a user's message through the chat template, the answer the
    assistant's reply (lm-eval's option of that name); None: for a model fine-tuned on
    conversations alone (`MiniGPTLM.has_chat_markers`), so each model reads prompts in the form it
    was trained on."""
    import random

    import numpy as np
    import torch
    from lm_eval.evaluator import evaluate

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    for task in loaded["tasks"].values():
        if num_fewshot is not None and task.get_config("num_fewshot") != 0:
            task.set_config(key="num_fewshot", value=num_fewshot)
        elif task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=seed)
    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its per-request INFO lines drown the table
    if apply_chat_template is None:
        apply_chat_template = bool(getattr(lm, "has_chat_markers", False))
    return evaluate(
        lm=lm,
        task_dict=loaded,
        limit=limit,
        bootstrap_iters=bootstrap_iters,
        log_samples=False,
        apply_chat_template=apply_chat_template,
    )


def scores(result: dict[str, Any]) -> list[Score]:
    """The rows of an lm-eval result: every metric of every task, with its stderr and document count."""
    rows = []
    for task, figures in result["results"].items():
        n = int(result.get("n-samples", {}).get(task, {}).get("effective", 0))
        for key, value in figures.items():
            metric, comma, kind = key.partition(",")  # lm-eval's keys: "metric,filter"
            if not comma or metric.endswith("_stderr") or not isinstance(value, int | float):
                continue
            stderr = figures.get(f"{metric}_stderr,{kind}")
            name = metric if kind in ("", "none") else f"{metric},{kind}"
            rows.append(
                Score(task, name, float(value), float(stderr) if isinstance(stderr, int | float) else None, n)
            )
    return rows
