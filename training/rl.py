"""`LitGRPO`: reinforcement learning from checkable answers, GRPO-style (configs/rl.yaml).

A step, top-down in `training_step`: each question of the batch gets a group of answers sampled
by the model itself with the KV cache (`model.generation`, the generator seeded from the step, so
a resumed run draws the same answers); the reward function the config names scores each
(`rewards.py`); advantages are the rewards less their group's mean; the loss is the policy
gradient over the answers' tokens, per token, plus an optional KL term to the starting weights
(`grpo.py`); then the backward pass and the update, as `LitGPT` writes them. Validation scores
held-out questions by the log-likelihood of their choices, as evaluate.py's tasks do.

The reference for the KL term: with LoRA, the same network with its adapters switched off; with
every weight training, a second network built from `init_from`, frozen and kept out of the
checkpoints. No copy can be avoided there: the answers are new every step, so the reference's
log-probabilities cannot be computed once beforehand.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from minigpt.model import GPT, ConfigError, GPTConfig, generate_tokens
from minigpt.model.sampling import check_sampling

from .config import LoRAConfig, OptimConfig
from .grpo import (
    answer_batch,
    cut_at_stop,
    group_advantages,
    kl_to_reference,
    policy_loss,
    step_generator,
    token_log_probs,
)
from .lit import LitGPT
from .loggers import step_logs_written
from .rewards import reward_function
from .weights import build_network


@dataclass(frozen=True)
class GRPOConfig:
    """How answers are drawn and scored, and what the loss adds to the policy gradient."""

    reward: str = "play_choice"
    """The reward function, by its registered name or as `package.module:function` (training/rewards.py)."""
    answers_per_question: int = 8
    """Answers sampled for each question: the group each answer's advantage is measured against."""
    max_new_tokens: int = 32
    """Tokens an answer may hold (fewer where the prompt leaves less of the context)."""
    temperature: float = 1.0
    """Sampling temperature of the answers (above 0: greedy answers would all be the same)."""
    top_k: int | None = None
    """Draw each token from the k likeliest alone (null: all)."""
    top_p: float | None = None
    """Draw each token from the likeliest tokens holding this much probability (null: all)."""
    scale_rewards: bool = False
    """Divide each advantage by its group's standard deviation, as GRPO's paper does."""
    kl_coef: float = 0.0
    """Weight of the KL term to the starting weights (0: none, and no reference is kept)."""
    seed: int = 1337
    """With the step, seeds the sampling of the answers."""

    def __post_init__(self) -> None:
        if self.answers_per_question < 2:
            raise ConfigError(f"answers_per_question must be at least 2, got {self.answers_per_question}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise ConfigError(
                f"temperature must be above 0 (greedy answers are all one), got {self.temperature}"
            )
        check_sampling(self.temperature, self.top_k, self.top_p)
        if self.kl_coef < 0:
            raise ConfigError(f"kl_coef must be 0 or more, got {self.kl_coef}")


class LitGRPO(LitGPT):
    """Trains a GPT on the rewards of its own answers. The network, optimizer, schedule, LoRA,
    clipping and checkpoints are `LitGPT`'s; the step and validation are this class's."""

    def __init__(
        self,
        gpt: GPTConfig = GPTConfig(),
        optim: OptimConfig = OptimConfig(),
        init_from: str | None = None,
        lora: LoRAConfig | None = None,
        rl: GRPOConfig = GRPOConfig(),
    ) -> None:
        """
        Args:
            gpt: Shape of the network (filled in from `init_from`).
            optim: Optimizer and learning-rate schedule.
            init_from: The weights to start from: a fine-tuned run folder, a checkpoint or GPT-2's.
            lora: Train LoRA adapters instead of every weight (as in lora.yaml); null: every weight.
            rl: The answers, the reward and the KL term.
        """
        super().__init__(gpt=gpt, optim=optim, init_from=init_from, lora=lora)
        self.rl = rl
        self.reward = reward_function(rl.reward)  # an unknown name stops the run here, in one line
        self.hparams["rl"] = asdict(rl)
        self._reference: list[GPT] = []
        """The starting weights' network, when the KL term needs one of its own (in a list: no submodule)."""
        self._val_counts: torch.Tensor | None = None

    def configure_model(self) -> None:
        config = self.gpt_config  # the weights' shape, before the chat markers' rows
        super().configure_model()
        if self.rl.kl_coef and self.lora is None and not self._reference:
            started = self.hparams.get("init_from")  # a resumed run's own init_from is None
            if started is None:
                raise ConfigError(
                    "model.rl.kl_coef needs the weights the run starts from: set model.init_from"
                )
            tokenizer = self.trainer.datamodule.tokenizer
            reference, _ = build_network(config, tokenizer, started, None, started)
            self._reference = [reference.requires_grad_(False).eval()]

    # -- the step ----------------------------------------------------------------------------

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        """One micro-batch of questions, `(prompts, lengths, indices)`: answers, rewards, the loss,
        its backward, and on the step's last micro-batch the update. Logs `train_loss`,
        `train_reward` (the mean reward of the answers), `answer_tokens` (their mean length) and,
        with the KL term, `train_kl`, on the steps whose logs are written."""
        prompts, lengths, indices = batch
        trainer = self.trainer
        accumulated = trainer.accumulate_grad_batches
        micro = batch_idx % accumulated
        last = micro == accumulated - 1 or trainer.is_last_batch
        if micro == 0:
            self._step_figures: list[torch.Tensor] = []
        generator = step_generator(self.rl.seed, trainer.global_step, micro, self.device)
        questions = [prompt[:length] for prompt, length in zip(prompts, lengths.tolist(), strict=True)]
        answers = self.sample(questions, generator)  # each question's group, in order
        data = trainer.datamodule
        stop_ids = self.stop_ids
        texts = [data.tokenizer.decode([i for i in a.tolist() if i not in stop_ids]) for a in answers]
        group = self.rl.answers_per_question
        rows = [data.question(int(i)) for i in indices for _ in range(group)]
        rewards = torch.tensor([self.reward(text, row) for text, row in zip(texts, rows, strict=True)])
        advantages = group_advantages(rewards.view(-1, group), self.rl.scale_rewards).flatten()
        prompts_of = [q for q in questions for _ in range(group)]
        loss, kl = self.grpo_loss(prompts_of, answers, advantages.to(self.device))
        if micro == 0:
            self.optimizers().zero_grad(set_to_none=True)
        self.backward_and_update(loss / accumulated, last)
        tokens = torch.tensor([len(a) for a in answers], dtype=torch.float32)
        self._step_figures.append(torch.stack([loss.detach().cpu(), rewards.mean(), tokens.mean(), kl.cpu()]))
        if last and step_logs_written(trainer):
            figures = torch.stack(self._step_figures).mean(0)
            self.log("train_loss", figures[0])
            self.log("train_reward", figures[1], prog_bar=True)
            self.log("answer_tokens", figures[2])
            if self.rl.kl_coef:
                self.log("train_kl", figures[3])
        return loss.detach() / accumulated

    @property
    def stop_ids(self) -> set[int]:
        """The ids that end an answer: the chat markers and end-of-text."""
        tokenizer = self.trainer.datamodule.tokenizer
        return {*tokenizer.ids.values(), *([tokenizer.eot_id] if tokenizer.eot_id is not None else [])}

    def sample(self, questions: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        """`answers_per_question` answers to each prompt (P,), drawn with the KV cache in eval mode,
        each up to and with its end marker: the answers (n,), question after question."""
        context, group, stop_ids = (
            self.model.config.context_length,
            self.rl.answers_per_question,
            self.stop_ids,
        )
        end = self.trainer.datamodule.tokenizer.end_id
        settings = {"temperature": self.rl.temperature, "top_k": self.rl.top_k, "top_p": self.rl.top_p}
        answers = []
        with evaluating(self.model):
            for prompt in questions:
                room = min(self.rl.max_new_tokens, context - len(prompt))
                idx = prompt.expand(group, -1)
                steps = generate_tokens(
                    self.model, idx, room, stop_token=end, generator=generator, **settings
                )
                drawn = torch.cat(list(steps), dim=1)  # (G, n) inference tensors, copied below
                answers += [answer.clone() for answer in cut_at_stop(drawn, stop_ids)]
        return answers

    def grpo_loss(
        self, prompts: list[torch.Tensor], answers: list[torch.Tensor], advantages: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy-gradient loss over the answers' tokens per token, plus the weighted KL term,
        and the KL estimate (0 without the term). Without it, answers whose advantage is 0 add
        nothing to the gradient and are left out of the forward pass (their tokens still count)."""
        tokens = sum(len(a) for a in answers)
        kept = [i for i, a in enumerate(advantages.tolist()) if a != 0 or self.rl.kl_coef]
        kept = kept or [0]  # a step of zero gradients, as every step must have its backward
        pad = self.trainer.datamodule.tokenizer.end_id
        x, y = answer_batch([prompts[i] for i in kept], [answers[i] for i in kept], pad)
        log_probs = token_log_probs(self.model(x), y)
        loss = policy_loss(log_probs, y, advantages[kept], tokens)
        kl = torch.zeros((), device=loss.device)
        if self.rl.kl_coef:
            with torch.no_grad(), self.reference() as reference:
                before = token_log_probs(reference(x), y)
            kl = kl_to_reference(log_probs, before, y, tokens)
            loss = loss + self.rl.kl_coef * kl
        return loss, kl.detach()

    @contextmanager
    def reference(self):  # noqa: ANN201
        """The starting weights' network: LoRA's with the adapters off, else the frozen copy."""
        if self._reference:
            yield self._reference[0].to(self.device)
            return
        from peft.tuners.tuners_utils import BaseTunerLayer

        layers = [m for m in self.model.modules() if isinstance(m, BaseTunerLayer)]
        for layer in layers:
            layer.enable_adapters(False)
        try:
            with evaluating(self.model):
                yield self.model
        finally:
            for layer in layers:
                layer.enable_adapters(True)

    # -- validation --------------------------------------------------------------------------

    def on_validation_epoch_start(self) -> None:
        kinds = max(len(self.trainer.datamodule.kinds), 1)
        self._val_counts = torch.zeros(kinds, 3, device=self.device)  # right, right by acc_norm, asked

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        """Each question's choices scored by their log-likelihood after its prompt, and by that over
        the choice's characters (lm-eval's acc and acc_norm); the likeliest is its answer (the
        first of equals, as lm-eval takes it)."""
        x, y, counts, chars, labels, kinds = batch
        scores = token_log_probs(self.model(x), y).sum(dim=1)  # (N,): each choice's log-likelihood
        right = []
        for by in (scores, scores / chars):
            answers = torch.stack([s.argmax() for s in by.split(counts.tolist())])
            right.append((answers == labels).float())
        counted = torch.stack([*right, torch.ones_like(right[0])], dim=1)
        self._val_counts.index_add_(0, kinds, counted)

    def on_validation_epoch_end(self) -> None:
        """Log `val_accuracy` and `val_accuracy_norm` over the held-out questions, and with several
        kinds, `val_accuracy_<kind>` and `val_accuracy_norm_<kind>` for each."""
        counts = self.trainer.strategy.reduce(self._val_counts, reduce_op="sum")
        kinds = self.trainer.datamodule.kinds
        rows = [("", counts.sum(dim=0))] + (
            [(f"_{k}", c) for k, c in zip(kinds, counts, strict=True)] if len(kinds) > 1 else []
        )
        for suffix, (right, right_norm, asked) in rows:
            if asked:
                self.log(f"val_accuracy{suffix}", right / asked, prog_bar=not suffix)
                self.log(f"val_accuracy_norm{suffix}", right_norm / asked, prog_bar=not suffix)


@contextmanager
def evaluating(model: torch.nn.Module):  # noqa: ANN201
    """`model` in eval mode (no dropout) for the block, then back in the mode it was in."""
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)
