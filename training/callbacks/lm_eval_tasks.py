"""Evaluation during training: lm-evaluation-harness tasks on a fixed subset, every few validations."""

from __future__ import annotations

import time
from typing import Any

import lightning as L

from minigpt.model import ConfigError

from .dashboard import whole_model


class EvaluateTasks(L.Callback):
    """Runs lm-eval tasks on the model being trained every `every_n_validations` validations and
    logs each figure as `eval/<task>/<metric>` beside `val_loss` (CSV, wandb, the run report), with
    what it cost as `eval/seconds`; the run's closing line sums that cost.

    It scores the weights validation scores (the average, with `EMAWeights`), on rank 0, in the
    model's own precision, on the first `limit` documents of each task, so every evaluation of a
    run sees the same documents. lm-eval (the `eval` extra) is imported only when this callback is
    built. A task that does not exist, or whose data cannot be read, stops the run at its start
    rather than at the first evaluation.
    """

    def __init__(
        self,
        tasks: list[str],
        include_path: str | None = None,
        limit: int | None = 100,
        every_n_validations: int = 1,
        num_fewshot: int | None = None,
        batch_size: int = 16,
    ) -> None:
        """
        Args:
            tasks: lm-eval task names (its own, or those in `include_path`).
            include_path: A folder of lm-eval task YAML files of your own.
            limit: Documents of each task to score (null: all of them).
            every_n_validations: Evaluate at every n-th validation (1: each one).
            num_fewshot: Examples in each prompt (null: each task's own).
            batch_size: Sequences per forward pass.
        """
        from minigpt.evaluation.lm_eval import task_manager

        if not tasks:
            raise ConfigError("EvaluateTasks needs at least one task")
        if every_n_validations < 1 or (limit is not None and limit < 1):
            raise ConfigError("EvaluateTasks' every_n_validations and limit must be at least 1")
        self.tasks = list(tasks)
        self.include_path = include_path
        self.limit = limit
        self.every_n_validations = every_n_validations
        self.num_fewshot = num_fewshot
        self.batch_size = batch_size
        self._manager = task_manager(self.tasks, include_path)  # an unknown task stops the run here
        self.validations = 0
        """Validations seen, this run and before its resumes (saved in checkpoints)."""
        self.seconds_spent = 0.0
        """Seconds spent evaluating, in this process."""
        self.runs = 0
        """Evaluations made, in this process."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.is_global_zero and stage == "fit":
            from minigpt.evaluation.lm_eval import load_tasks

            load_tasks(self._manager, self.tasks)  # missing data stops the run before its first step

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Here rather than when validation ends: Lightning lets callbacks log only until then.
        if trainer.sanity_checking:
            return
        self.validations += 1
        if self.validations % self.every_n_validations:
            return
        model = whole_model(trainer, pl_module)  # every rank takes part (FSDP gathers the weights)
        if model is None:  # not rank 0
            return
        from minigpt.evaluation.harness import MiniGPTLM
        from minigpt.evaluation.lm_eval import evaluate_lm, load_tasks, scores

        start = time.perf_counter()
        lm = MiniGPTLM(model, trainer.datamodule.tokenizer, batch_size=self.batch_size)
        result = evaluate_lm(
            lm, load_tasks(self._manager, self.tasks), self.limit, self.num_fewshot, bootstrap_iters=0
        )
        seconds = time.perf_counter() - start
        self.seconds_spent += seconds
        self.runs += 1
        for row in scores(result):
            pl_module.log(f"eval/{row.task}/{row.metric}", row.value, rank_zero_only=True)
        pl_module.log("eval/seconds", seconds, rank_zero_only=True)

    def state_dict(self) -> dict[str, Any]:
        return {"validations": self.validations}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.validations = state_dict.get("validations", 0)
