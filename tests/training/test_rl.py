"""Reinforcement learning from checkable answers (training/rl.py, grpo.py, rewards.py): the
arithmetic on fixed tensors, then LitGRPO on a tiny model of ours and a toy task, trained by a
Trainer built here: the reward rises, the answers follow the step's seed, a resumed run ends bit
for bit where a straight one does, and validation scores choices as the lm-eval harness does."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from minigpt.checkpoints.load import save_safetensors
from minigpt.data.chat.conversations import IGNORE_INDEX
from minigpt.data.questions.datamodule import QuestionsConfig, QuestionsDataModule, read_questions
from minigpt.model import GPT, ConfigError, GPTConfig
from minigpt.training.config import OptimConfig
from minigpt.training.grpo import (
    answer_batch,
    group_advantages,
    kl_to_reference,
    policy_loss,
    step_generator,
    token_log_probs,
)
from minigpt.training.rewards import named_choice, play_choice, reward_function
from minigpt.training.rl import GRPOConfig, LitGRPO

from .helpers import BASE, assert_identical, read_metrics

SHAPE = GPTConfig(vocab_size=BASE.n_vocab, context_length=64, n_layer=2, n_head=2, n_embd=32)
DIGITS = "tests.training.test_rl:digit_share"


def digit_share(answer: str, question: Mapping[str, Any]) -> float:
    """The toy task's reward: the share of the answer's characters that are digits."""
    return sum(c.isdigit() for c in answer) / max(len(answer), 1)


# -- the arithmetic ----------------------------------------------------------------------------


def test_group_advantages_sum_to_zero_and_equal_rewards_give_none() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.9, 0.4, 0.0], [0.5, 0.5, 0.5, 0.5]])
    for scale in (False, True):
        advantages = group_advantages(rewards, scale)
        torch.testing.assert_close(advantages.sum(dim=1), torch.zeros(3), atol=1e-6, rtol=0)
        assert torch.equal(advantages[2], torch.zeros(4))
    torch.testing.assert_close(group_advantages(rewards)[0], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    scaled = group_advantages(rewards, scale=True)[0]  # the group's std is 0.5
    torch.testing.assert_close(scaled, torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-3, rtol=0)


def test_the_loss_by_hand() -> None:
    # Two answers of a prompt of one token: the first 2 tokens long, the second 1; vocabulary of 3.
    logits = torch.tensor(
        [
            [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [9.0, 9.0, 9.0]],
            [[0.0, 2.0, 0.0], [5.0, 5.0, 5.0], [7.0, 0.0, 0.0]],
        ]
    )
    targets = torch.tensor([[1, 0, IGNORE_INDEX], [1, IGNORE_INDEX, IGNORE_INDEX]])
    log_probs = token_log_probs(logits, targets)
    third, e = math.log(1 / 3), math.e
    expected = [[third, math.log(e / (e + 2)), 0.0], [math.log(e**2 / (e**2 + 2)), 0.0, 0.0]]
    torch.testing.assert_close(log_probs, torch.tensor(expected))
    advantages = torch.tensor([0.5, -0.5])
    loss = policy_loss(log_probs, targets, advantages, tokens=3)
    by_hand = -(0.5 * (expected[0][0] + expected[0][1]) - 0.5 * expected[1][0]) / 3
    assert loss.item() == pytest.approx(by_hand)
    # The KL term: exp(r) - r - 1 per answer token, r the reference's log-probability less the policy's.
    reference = log_probs + torch.tensor([[0.1, -0.2, 5.0], [0.3, 7.0, 7.0]])
    by_hand = sum(math.exp(r) - r - 1 for r in (0.1, -0.2, 0.3)) / 3
    assert kl_to_reference(log_probs, reference, targets, tokens=3).item() == pytest.approx(by_hand, rel=1e-5)
    assert kl_to_reference(log_probs, log_probs, targets, tokens=3).item() == 0


def test_answer_batch_targets_only_the_answers() -> None:
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([8])]
    answers = [torch.tensor([1, 2]), torch.tensor([3, 4, 9])]
    x, y = answer_batch(prompts, answers, pad_id=0)
    assert x.tolist() == [[5, 6, 7, 1], [8, 3, 4, 0]]
    ignore = IGNORE_INDEX
    assert y.tolist() == [[ignore, ignore, 1, 2], [3, 4, 9, ignore]]


def test_prompt_and_padding_change_nothing_in_the_loss() -> None:
    torch.manual_seed(0)
    model = GPT(SHAPE)
    prompts = [torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10])]
    answers = [torch.tensor([11, 12]), torch.tensor([13, 14, 15, 16])]
    advantages = torch.tensor([0.7, -0.3])

    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return policy_loss(token_log_probs(model(x), y), y, advantages, tokens=6)

    x, y = answer_batch(prompts, answers, pad_id=0)
    first = loss(x, y)
    # Other padding ids, and more padding.
    x2, y2 = answer_batch(prompts, answers, pad_id=42)
    assert torch.equal(loss(x2, y2), first)
    wider_x = torch.cat([x, torch.full((2, 5), 3)], dim=1)
    wider_y = torch.cat([y, torch.full((2, 5), IGNORE_INDEX)], dim=1)
    torch.testing.assert_close(loss(wider_x, wider_y), first, atol=1e-6, rtol=0)
    # Logits at the prompt's and the padding's positions count for nothing.
    logits = model(x)
    scrambled = torch.where((y == IGNORE_INDEX)[..., None], torch.randn_like(logits) * 10, logits)
    assert torch.equal(policy_loss(token_log_probs(scrambled, y), y, advantages, 6), first)


def test_equal_rewards_give_a_zero_gradient() -> None:
    torch.manual_seed(0)
    model = GPT(SHAPE)
    prompts = [torch.tensor([5, 6, 7])] * 4
    answers = [torch.tensor([11, 12]), torch.tensor([13]), torch.tensor([14, 15, 16]), torch.tensor([17])]
    x, y = answer_batch(prompts, answers, pad_id=0)
    for rewards, zero in ((torch.full((1, 4), 0.75), True), (torch.tensor([[1.0, 0.0, 0.0, 0.0]]), False)):
        model.zero_grad()
        advantages = group_advantages(rewards, scale=True).flatten()
        policy_loss(token_log_probs(model(x), y), y, advantages, tokens=7).backward()
        gradients = [p.grad for p in model.parameters() if p.grad is not None]
        assert all(torch.count_nonzero(g) == 0 for g in gradients) == zero


def test_sampling_follows_the_seed_and_the_step() -> None:
    probs = torch.full((1, 100), 0.01)

    def draws(seed: int, step: int, micro: int) -> list[int]:
        return torch.multinomial(
            probs, 20, replacement=True, generator=step_generator(seed, step, micro, torch.device("cpu"))
        ).tolist()

    assert draws(1, 5, 0) == draws(1, 5, 0)
    assert len({str(draws(*key)) for key in [(1, 5, 0), (1, 6, 0), (2, 5, 0), (1, 5, 1)]}) == 4


# -- rewards -----------------------------------------------------------------------------------


def test_play_choice_rewards_the_choice_the_answer_names() -> None:
    question = {"choices": ["ROMEO", "JULIET", "NURSE", "TYBALT"], "label": 1}
    assert play_choice(" JULIET", question) == 1.0
    assert play_choice("NURSE", question) == 0.0
    lines = {"choices": ["And shall I go to bed?", "What light through yonder window breaks?"], "label": 1}
    assert play_choice("What light through yonder door", lines) == 1.0  # nearer the right line
    assert play_choice("And shall I go", lines) == 0.0
    assert named_choice("xyz", ["ab", "cd"]) is None  # equally far from both: names neither


def test_an_unknown_reward_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        LitGRPO(rl=GRPOConfig(reward="exactly"))
    message = str(refused.value)
    assert "\n" not in message and "'exactly'" in message and "play_choice" in message
    with pytest.raises(ConfigError, match="cannot load 'no_such_module:f'"):
        reward_function("no_such_module:f")
    assert reward_function(DIGITS) is digit_share


# -- LitGRPO on a toy task ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random GPT of ours (char ids) and 24 questions, as the play questions' files hold them."""
    folder = tmp_path_factory.mktemp("rl")
    torch.manual_seed(0)
    save_safetensors(GPT(SHAPE), BASE, folder / "base.safetensors")
    rows = [
        {
            "instruction": f"Count to {n}.",
            "choices": [str(n), "no"],
            "label": i % 2,
            "kind": "count" if i % 3 else "say",
        }
        for i, n in enumerate(range(24))
    ]
    (folder / "questions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder / "base.safetensors", folder / "questions.jsonl"


Run = tuple[LitGRPO, QuestionsDataModule, L.Trainer, list[dict[str, float]]]


def grpo_run(task: tuple[Path, Path], folder: Path, steps: int, **rl: Any) -> Run:
    """LitGRPO for `steps` steps on the toy task with the digits' reward and a little KL, its data,
    its trainer (last.ckpt in `folder`), and the list each step's logged figures go to."""
    weights, questions = task
    data = QuestionsDataModule(
        QuestionsConfig(source=str(questions), val_source=str(questions), batch_size=4), 64
    )
    data.use_tokenizer(BASE.spec())
    settings = {"reward": DIGITS, "answers_per_question": 6, "max_new_tokens": 8, "kl_coef": 0.05, **rl}
    optim = OptimConfig(optimizer="adamw", lr=1e-2, min_lr=1e-2, warmup_steps=0, weight_decay=0.0)
    module = LitGRPO(gpt=SHAPE, optim=optim, init_from=str(weights), rl=GRPOConfig(**settings))
    figures: list[dict[str, float]] = []

    class Figures(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            figures.append({name: float(value) for name, value in trainer.callback_metrics.items()})

    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", precision="32-true", logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1, limit_val_batches=0,
        default_root_dir=folder, callbacks=[Figures(), ModelCheckpoint(dirpath=folder, save_last=True)],
    )  # fmt: skip
    return module, data, trainer, figures


STEPS = 8  # the toy task's epoch is 6 steps (24 questions, 4 a step)


@pytest.fixture(scope="module")
def straight(task: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Run:
    run = grpo_run(task, tmp_path_factory.mktemp("straight"), STEPS)
    module, data, trainer, _ = run
    trainer.fit(module, datamodule=data)
    return run


@pytest.mark.slow  # trains or evaluates a model for seconds
def test_a_few_steps_raise_the_reward(straight: Run) -> None:
    rewards = [step["train_reward"] for step in straight[3]]
    assert len(rewards) == STEPS
    assert sum(rewards[-3:]) > 2 * sum(rewards[:3]), rewards
    kl = [step["train_kl"] for step in straight[3]]
    assert (
        kl[0] == 0 and all(value >= 0 for value in kl) and max(kl) > 0
    )  # the first step's policy is the reference


@pytest.mark.slow  # trains or evaluates a model for seconds
def test_the_answers_follow_the_steps_seed(straight: Run) -> None:
    module, data, _, _ = straight
    prompt = torch.tensor(data._prompts.prompts[0])
    draw = [module.sample([prompt], step_generator(1337, step, 0, torch.device("cpu"))) for step in (3, 3, 4)]
    assert_identical(draw[1], draw[0], "the same step")
    assert any(not torch.equal(a, b) for a, b in zip(draw[0], draw[2], strict=True))


@pytest.mark.slow  # trains or evaluates a model for seconds
def test_a_resumed_run_ends_bit_for_bit_as_a_straight_one(
    straight: Run, task: tuple[Path, Path], tmp_path: Path
) -> None:
    module, data, trainer, _ = grpo_run(task, tmp_path, 3)  # stops in mid-epoch
    trainer.fit(module, datamodule=data)
    module, data, trainer, figures = grpo_run(task, tmp_path, STEPS)
    module.init_from = None  # as train.py resumes: the weights come from the checkpoint
    trainer.fit(module, datamodule=data, ckpt_path=str(tmp_path / "last.ckpt"))
    assert figures == straight[3][3:]  # rewards, losses and KL of every step after the resume
    resumed = torch.load(tmp_path / "last.ckpt", weights_only=True)
    done = torch.load(Path(straight[2].default_root_dir) / "last.ckpt", weights_only=True)
    for key in ("state_dict", "optimizer_states", "lr_schedulers", "global_step"):
        assert_identical(resumed[key], done[key], key)


@pytest.mark.slow  # trains or evaluates a model for seconds
def test_validation_scores_choices_as_the_harness_does(task: tuple[Path, Path]) -> None:
    """Each held-out question answered by its likeliest choice after the chat prompt, as evaluate.py's
    tasks answer it through MiniGPTLM (lm-eval's chat path: no space before the choice)."""
    from minigpt.evaluation.harness import MiniGPTLM

    module, data, _, _ = grpo_run(task, Path("unused"), 1)
    data.setup()
    torch.manual_seed(1)
    module.model = GPT(replace(SHAPE, vocab_size=data.tokenizer.n_vocab)).eval()
    module._val_counts = torch.zeros(len(data.kinds), 3)
    for batch in data.val_dataloader():
        module.validation_step(batch, 0)
    lm = MiniGPTLM(module.model, data.tokenizer)
    expected = torch.zeros(len(data.kinds), 3)
    for row in read_questions(str(task[1]), "test", None):  # all 24, in order (val_questions is 256)
        context = lm.apply_chat_template([{"role": "user", "content": row["instruction"]}])
        requests = [(None, *lm._encode_pair(context, choice)) for choice in row["choices"]]
        scores = [score for score, _ in lm._loglikelihood_tokens(requests)]
        normed = [score / len(choice) for score, choice in zip(scores, row["choices"], strict=True)]
        right = [float(s.index(max(s)) == row["label"]) for s in (scores, normed)]
        expected[data.kinds.index(row["kind"])] += torch.tensor([*right, 1.0])
    torch.testing.assert_close(module._val_counts, expected, atol=0, rtol=0)
    assert 0 < expected[:, 0].sum() < 24 and 0 < expected[:, 1].sum() < 24  # some right, some wrong


@pytest.mark.slow  # imports peft
def test_under_lora_the_reference_is_the_network_with_its_adapters_off(task: tuple[Path, Path]) -> None:
    from minigpt.checkpoints import load_model
    from minigpt.training.config import LoRAConfig
    from minigpt.training.lora import add_adapters

    base, _ = load_model(task[0])
    model, _ = load_model(task[0])
    add_adapters(model, LoRAConfig(rank=2, alpha=4, dropout=0.0, targets=("W_query", "W_value")))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter)  # adapters that have trained
    module = LitGRPO(gpt=SHAPE, lora=LoRAConfig(rank=2, alpha=4, dropout=0.0), rl=GRPOConfig(kl_coef=0.1))
    module.model = model.train()
    x = torch.randint(0, BASE.n_vocab, (2, 10))
    with torch.no_grad(), module.reference() as reference:
        assert torch.equal(reference(x), base(x))
    assert module.model.training and not torch.allclose(module.model(x), base(x))  # the adapters back on
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)


def rl_args(task: tuple[Path, Path], run: Path, *extra: str) -> list[str]:
    weights, questions = task
    return [
        "--config", "rl.yaml", "--model.init_from", str(weights),
        "--data.questions.source", str(questions), "--data.questions.val_source", str(questions),
        "--data.questions.kinds", "null", "--data.questions.batch_size", "4",
        "--model.rl.answers_per_question", "3", "--model.rl.max_new_tokens", "4",
        "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.log_every_n_steps", "1",
        "--trainer.precision", "32-true", "--trainer.accelerator", "cpu",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(run), *extra,
    ]  # fmt: skip


@pytest.mark.slow  # trains through train.py
def test_rl_yaml_trains_through_train_py(
    task: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from minigpt.checkpoints import load_model
    from minigpt.cli.train import train_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert train_main(rl_args(task, tmp_path / "bad", "--model.rl.reward", "exactly")) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no reward is named 'exactly'" in line and "play_choice" in line
    assert train_main(rl_args(task, tmp_path / "run")) == 0
    logged = read_metrics(tmp_path / "run")
    assert {"train_reward", "train_loss", "answer_tokens", "val_accuracy", "val_accuracy_norm"} <= set(
        logged[0]
    )
    assert {"val_accuracy_count", "val_accuracy_say"} <= set(logged[0])  # each kind apart
    assert sorted((tmp_path / "run" / "checkpoints").iterdir()) == [
        tmp_path / "run" / "checkpoints" / "last.ckpt"
    ]
    model, tokenizer = load_model(tmp_path / "run")  # what chat.py, serve.py and export.py read
    assert tokenizer.n_vocab == model.config.vocab_size == BASE.n_vocab + 4
