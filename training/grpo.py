"""The arithmetic of reinforcement learning from checkable answers, GRPO-style: pure functions of
tensors, which `rl.py`'s step calls in order.

- Each question's answers form a group; an answer's advantage is its reward less the group's
  mean (optionally over the group's standard deviation), so a group whose answers all earn the
  same teaches nothing, and the advantages of a group sum to zero.
- The loss is the policy gradient over the answers' tokens alone: minus each token's
  log-probability times its answer's advantage, summed and divided by the answer tokens of the
  batch (per token, so a long answer weighs by its length, not as one sample).
- The optional KL term to the starting weights is the estimator exp(r) - r - 1 with r the
  reference's log-probability less the policy's, per answer token: never negative, zero where
  the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from minigpt.data.chat.conversations import IGNORE_INDEX


def group_advantages(rewards: torch.Tensor, scale: bool = False, eps: float = 1e-4) -> torch.Tensor:
    """Advantages (Q, G) of rewards (Q, G), a group of G answers per question: each reward less its
    group's mean; with `scale`, divided by the group's standard deviation (population's) plus `eps`."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (rewards.std(dim=1, keepdim=True, correction=0) + eps)
    return centred


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The log-probability, fp32 (N, T), of each target (N, T) under logits (N, T, V); 0 where the
    target is IGNORE_INDEX."""
    losses = F.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    return -losses.view(targets.shape)


def policy_loss(
    log_probs: torch.Tensor, targets: torch.Tensor, advantages: torch.Tensor, tokens: int | torch.Tensor
) -> torch.Tensor:
    """Minus the advantage-weighted log-probabilities (N, T) of the answers' tokens (where targets
    (N, T) are not IGNORE_INDEX), each row's advantage (N,), over `tokens` answer tokens."""
    answer = targets != IGNORE_INDEX
    return -(advantages[:, None] * log_probs * answer).sum() / tokens


def kl_to_reference(
    log_probs: torch.Tensor, reference: torch.Tensor, targets: torch.Tensor, tokens: int | torch.Tensor
) -> torch.Tensor:
    """The KL estimate exp(r) - r - 1, r = reference - policy log-probability (N, T), summed over
    the answers' tokens and over `tokens`."""
    answer = targets != IGNORE_INDEX
    ratio = (reference - log_probs) * answer
    return ((ratio.exp() - ratio - 1) * answer).sum() / tokens


def step_generator(seed: int, step: int, micro_batch: int, device: torch.device) -> torch.Generator:
    """The generator a step's answers are drawn with: a function of the run's seed, the optimizer
    step and the micro-batch within it alone, so a resumed run draws what it would have drawn."""
    state = np.random.SeedSequence([seed, step, micro_batch]).generate_state(2, dtype=np.uint32)
    return torch.Generator(device).manual_seed(int(state[0]) << 32 | int(state[1]))


def cut_at_stop(answers: torch.Tensor, stop_ids: Sequence[int]) -> list[torch.Tensor]:
    """Each answer (G, n) up to and with its first stop id (the turn's end, which the model chose
    too); the whole of one that has none."""
    stops = torch.isin(answers, torch.tensor(list(stop_ids), device=answers.device))
    cut = []
    for answer, stopped in zip(answers, stops, strict=True):
        at = stopped.nonzero()
        cut.append(answer[: int(at[0]) + 1] if len(at) else answer)
    return cut


def answer_batch(
    prompts: Sequence[torch.Tensor], answers: Sequence[torch.Tensor], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (N, T) of each prompt followed by its answer, padded on the right: the
    targets are the answer's ids where the next id is one of them, IGNORE_INDEX elsewhere (the
    prompt and the padding)."""
    width = max(len(p) + len(a) for p, a in zip(prompts, answers, strict=True)) - 1
    device = prompts[0].device
    x = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    y = torch.full((len(prompts), width), IGNORE_INDEX, dtype=torch.long, device=device)
    for row, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        ids = torch.cat([prompt, answer])
        x[row, : len(ids) - 1] = ids[:-1]
        y[row, len(prompt) - 1 : len(ids) - 1] = answer
    return x, y
