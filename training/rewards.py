"""Reward functions for reinforcement learning (rl.yaml), found by name.

A reward function takes the model's answer (its text, the turn's end marker left out) and the
question's row as the data holds it, and returns a float; larger is better. The run's
`model.rl.reward` names one: a name registered here, or `package.module:function` for one of
your own (docs/reinforcement.md, "Your own reward").

    @register_reward("exact")
    def exact(answer: str, question: Mapping[str, Any]) -> float:
        return float(answer.strip() == question["choices"][question["label"]])
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping
from typing import Any

from minigpt.model import ConfigError

Reward = Callable[[str, Mapping[str, Any]], float]
"""(answer, question row) -> reward."""

REWARDS: dict[str, Reward] = {}
"""Each registered reward by its name."""


def register_reward(name: str) -> Callable[[Reward], Reward]:
    """Register the decorated function as the reward `name`."""

    def register(function: Reward) -> Reward:
        if name in REWARDS:
            raise ValueError(f"a reward is already registered as {name!r}")
        REWARDS[name] = function
        return function

    return register


def reward_function(name: str) -> Reward:
    """The reward `name` names: registered here, or `package.module:function`.

    Raises:
        ConfigError: No reward of that name, or a module or function that cannot be found (one line).
    """
    if name in REWARDS:
        return REWARDS[name]
    if ":" not in name:
        known = ", ".join(sorted(REWARDS))
        raise ConfigError(
            f"model.rl.reward: no reward is named {name!r}; the names: {known} (or package.module:function)"
        )
    module_name, _, attribute = name.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"model.rl.reward: cannot load {name!r}: {error}") from None
    if not callable(function):
        raise ConfigError(f"model.rl.reward: {name!r} is not a function")
    return function


def named_choice(answer: str, choices: list[str]) -> int | None:
    """The index of the choice `answer` names: the one it equals (spaces around either ignored),
    else the one it is nearest to by difflib's ratio; None when two are equally near."""
    answer = answer.strip()
    stripped = [choice.strip() for choice in choices]
    if answer in stripped:
        return stripped.index(answer)
    nearness = [difflib.SequenceMatcher(None, answer, choice, autojunk=False).ratio() for choice in stripped]
    best = max(nearness)
    return nearness.index(best) if nearness.count(best) == 1 else None


@register_reward("play_choice")
def play_choice(answer: str, question: Mapping[str, Any]) -> float:
    """1 when the answer names the right choice (`named_choice`), else 0: the play questions' reward.

    A speaker question lists its choices, and a right answer writes the name; a next-line question
    does not, and the answer is read as the line it comes nearest to, so a line nearer the true
    one than every other choice earns the reward before the model can write it whole."""
    return float(named_choice(answer, list(question["choices"])) == question["label"])
