"""EvaluateTasks: lm-eval tasks on local files during training, every n-th validation, logged beside
val_loss, in the report, and counted in the closing line; declared as the YAML declares callbacks."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import lightning as L
import pytest
from jsonargparse import ArgumentParser
from lightning.pytorch.loggers import CSVLogger

lm_eval_tasks = pytest.importorskip(
    "lm_eval.tasks", reason="lm-evaluation-harness is not installed (pip install -e '.[eval]')"
)

from minigpt.common import UsageError  # noqa: E402
from minigpt.data import DataConfig, TextDataModule  # noqa: E402
from minigpt.evaluation.harness import MiniGPTLM  # noqa: E402
from minigpt.evaluation.lm_eval import evaluate_lm, load_tasks, scores, task_manager  # noqa: E402
from minigpt.model import ConfigError, GPTConfig  # noqa: E402
from minigpt.training.callbacks.console import RunSummary  # noqa: E402
from minigpt.training.callbacks.lm_eval_tasks import EvaluateTasks  # noqa: E402
from minigpt.training.lit import LitGPT  # noqa: E402
from minigpt.viz.report import write_run_report  # noqa: E402

from .conftest import CHOICES, TEXTS  # noqa: E402
from .helpers import TEXT  # noqa: E402


def test_tasks_are_scored_every_second_validation_and_logged_beside_val_loss(
    tasks: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    corpus = tmp_path / "corpus.txt"  # every character the tasks use, so the char model reads them
    questions = " ".join(d["question"] + " " + " ".join(d["choices"]) for d in CHOICES)
    corpus.write_text((TEXT + questions + " ".join(d["text"] for d in TEXTS)) * 20)
    data = TextDataModule(
        DataConfig(source=str(corpus), tokenizer="char", cache_dir=str(tmp_path / "cache"), batch_size=4),
        context_length=16,
    )
    # Declared as the YAML declares callbacks (class_path and init_args, parsed by jsonargparse).
    parser = ArgumentParser()
    parser.add_argument("--callbacks", type=list[L.Callback])
    declared = f"""
      - class_path: minigpt.training.callbacks.lm_eval_tasks.EvaluateTasks
        init_args:
          {{tasks: [mini_choice, mini_text], include_path: {tasks}, limit: 3, every_n_validations: 2}}
    """
    (evaluate,) = parser.instantiate_classes(parser.parse_args(["--callbacks", declared])).callbacks
    trainer = L.Trainer(
        max_steps=2,
        val_check_interval=1,
        limit_val_batches=1,
        accelerator="cpu",
        num_sanity_val_steps=0,
        logger=CSVLogger(tmp_path, name="csv"),
        callbacks=[evaluate, RunSummary()],
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    with caplog.at_level(logging.INFO, logger="minigpt"):
        trainer.fit(LitGPT(GPTConfig(context_length=16, n_layer=1, n_head=2, n_embd=16)), datamodule=data)
    (log,) = tmp_path.glob("csv/version_*/metrics.csv")
    rows = list(csv.DictReader(log.open()))
    validated = [r["step"] for r in rows if r.get("val_loss")]
    evaluated = [r["step"] for r in rows if r.get("eval/mini_choice/acc")]
    assert len(validated) == 2 and evaluated == validated[1:]
    # The last evaluation scored the final weights: the same figures as scoring them afresh.
    model = trainer.lightning_module.model
    fresh = evaluate_lm(
        MiniGPTLM(model, data.tokenizer),
        load_tasks(task_manager(["mini_choice", "mini_text"], str(tasks)), ["mini_choice", "mini_text"]),
        limit=3,
        bootstrap_iters=0,
    )
    last = [r for r in rows if r.get("eval/mini_text/bits_per_byte")][-1]
    for row in scores(fresh):
        assert float(last[f"eval/{row.task}/{row.metric}"]) == pytest.approx(row.value, rel=1e-5)
    seconds = [float(r["eval/seconds"]) for r in rows if r.get("eval/seconds")]
    assert len(seconds) == 1 and evaluate.runs == 1 and sum(seconds) == pytest.approx(evaluate.seconds_spent)
    assert "; task evaluation " in caplog.text and " over 1 validation\n" in caplog.text
    _, report = write_run_report(tmp_path)
    html = report.read_text()
    assert "mini_text/bits_per_byte" in html and "task evaluation time" in html


def test_it_refuses_no_task_and_an_unknown_task_at_once(tasks: Path, monkeypatch) -> None:
    with pytest.raises(ConfigError, match="at least one task"):
        EvaluateTasks([])
    # Indexing lm-eval's own 10,000 task files takes seconds; the local folder decides here.
    manager = lm_eval_tasks.TaskManager
    monkeypatch.setattr(
        lm_eval_tasks,
        "TaskManager",
        lambda include_path=None, **_: manager(include_path=include_path, include_defaults=False),
    )
    with pytest.raises(UsageError, match="unknown task 'mini_chioce'"):
        EvaluateTasks(["mini_chioce"], str(tasks))
