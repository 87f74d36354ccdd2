"""Preference losses on the log-probabilities of answers: DPO's (`sigmoid`) and IPO's (`ipo`).

Both compare how much more likely the policy makes the chosen answer than the reference does,
against the same for the rejected answer: `h = (chosen - ref_chosen) - (rejected - ref_rejected)`.

- `sigmoid` (DPO, Rafailov et al. 2023): `-log σ(β h)`, on answers' summed log-probabilities.
  Where policy and reference agree, `h = 0` and the loss is ln 2.
- `ipo` (IPO, Azar et al. 2023): `(h - 1 / (2β))²`, on answers' mean log-probability per token,
  as TRL computes it.

The implicit rewards are `β (chosen - ref_chosen)` and `β (rejected - ref_rejected)`, whatever
the loss: TRL's `rewards/chosen`, `rewards/rejected`, their difference `rewards/margins`, and
`rewards/accuracies`, the share of pairs whose chosen answer's reward is the higher.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minigpt.data.chat.conversations import IGNORE_INDEX
from minigpt.model import ConfigError

LOSS_TYPES = ("sigmoid", "ipo")
"""The preference losses `DPOConfig.loss_type` names."""
REWARD_NAMES = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")
"""The logged names of `reward_stats`' values, as TRL logs them."""


@dataclass(frozen=True)
class DPOConfig:
    """Preference tuning: the loss, and how far the policy may move from where it started."""

    beta: float = 0.1
    """The rewards' scale: the larger, the more a change of log-probability costs; the policy
    stays nearer the reference."""
    loss_type: str = "sigmoid"
    """"sigmoid" (DPO) or "ipo"."""

    def __post_init__(self) -> None:
        if not self.beta > 0:
            raise ConfigError(f"dpo.beta must be positive, got {self.beta}")
        if self.loss_type not in LOSS_TYPES:
            raise ConfigError(f"dpo.loss_type must be one of {', '.join(LOSS_TYPES)}, got {self.loss_type!r}")


def answer_logps(token_losses: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probability of each row's answer, summed over its tokens, `(...)` fp32, and the
    number of those tokens, `(...)`: from the cross-entropy of every position, `(..., T)`, and
    the targets `(..., T)`, IGNORE_INDEX outside the answer."""
    answer = targets != IGNORE_INDEX
    return -(token_losses * answer).sum(-1), answer.sum(-1)


def preference_losses(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    config: DPOConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each pair's loss `(B,)`, and the chosen and rejected answers' rewards `(B,)` (no gradient),
    from the policy's and the reference's log-probabilities of the answers, `(B,)` each: summed
    over the tokens for `sigmoid`, their mean for `ipo`."""
    chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
    h = chosen_ratio - rejected_ratio
    if config.loss_type == "sigmoid":
        losses = -F.logsigmoid(config.beta * h)
    else:
        losses = (h - 1 / (2 * config.beta)) ** 2
    return losses, config.beta * chosen_ratio.detach(), config.beta * rejected_ratio.detach()


def reward_stats(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> torch.Tensor:
    """The means over the pairs of `REWARD_NAMES`, `(4,)`."""
    margins = chosen_rewards - rejected_rewards
    accuracies = (margins > 0).float()
    return torch.stack([chosen_rewards.mean(), rejected_rewards.mean(), margins.mean(), accuracies.mean()])
