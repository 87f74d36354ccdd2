"""Muon for the blocks' matrices beside AdamW, stepped as one optimizer; the wsd schedule."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from minigpt.model import GPT, ConfigError, GPTConfig
from minigpt.training.config import OptimConfig
from minigpt.training.optim import MuonWithAdamW, build_optimizer, build_scheduler, lr_at

CONFIG = GPTConfig(vocab_size=40, context_length=8, n_layer=2, n_head=2, n_embd=16)


def step(model: GPT, optimizer: torch.optim.Optimizer) -> None:
    ids = torch.randint(0, 40, (4, 8))
    loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def test_muon_takes_the_block_matrices_and_adamw_everything_else() -> None:
    torch.manual_seed(0)
    model = GPT(CONFIG)
    optimizer = build_optimizer(model, OptimConfig(optimizer="muon", muon_lr=0.05, lr=1e-3))
    assert isinstance(optimizer, MuonWithAdamW)
    muon = {id(p) for g in optimizer.muon.param_groups for p in g["params"]}
    adamw = {id(p) for g in optimizer.adamw.param_groups for p in g["params"]}
    expected_muon = {
        id(p) for name, p in model.named_parameters() if name.startswith("transformer.h.") and p.dim() == 2
    }
    assert muon == expected_muon and len(muon) == 2 * 6  # q, k, v, out, fc, proj per block
    assert adamw == {id(p) for p in model.parameters()} - muon  # embeddings (tied head), gains, biases
    assert [g["lr"] for g in optimizer.param_groups] == [0.05, 1e-3, 1e-3]


def test_the_value_and_skip_weights_are_adamw_scalars_without_decay() -> None:
    model = GPT(dataclasses.replace(CONFIG, value_residual=True, unet_skips=True))
    optimizer = build_optimizer(model, OptimConfig(optimizer="muon", weight_decay=0.1))
    scalars = {id(model.skip_weights), id(model.transformer.h[1].attn.value_lambdas)}
    undecayed = [g for g in optimizer.adamw.param_groups if g["weight_decay"] == 0.0]
    assert len(undecayed) == 1 and scalars <= {id(p) for p in undecayed[0]["params"]}


def test_muon_steps_move_every_parameter_and_its_state_round_trips() -> None:
    torch.manual_seed(0)
    model = GPT(CONFIG)
    optimizer = build_optimizer(model, OptimConfig(optimizer="muon"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    step(model, optimizer)
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters() if "ln_" not in n)

    # Two copies continue identically after one is restored from the other's state dict.
    twin = GPT(CONFIG)
    twin.load_state_dict(model.state_dict())
    twin_optimizer = build_optimizer(twin, OptimConfig(optimizer="muon"))
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # as a checkpoint holds it
    torch.manual_seed(1)
    step(model, optimizer)
    torch.manual_seed(1)
    step(twin, twin_optimizer)
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_the_schedule_scales_both_optimizers_learning_rates() -> None:
    model = GPT(CONFIG)
    config = OptimConfig(optimizer="muon", lr=1e-3, min_lr=0.0, muon_lr=0.02, warmup_steps=0)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total_steps=10)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    # Cosine at 5 of 10 steps: half the peak, for both.
    assert optimizer.muon.param_groups[0]["lr"] == pytest.approx(0.01)
    assert optimizer.adamw.param_groups[0]["lr"] == pytest.approx(5e-4)


def test_wsd_holds_the_peak_then_decays_linearly_over_the_last_fraction() -> None:
    config = OptimConfig(lr=1.0, min_lr=0.0, warmup_steps=9, schedule="wsd", decay_fraction=0.25)
    # 100 steps: warmup to step 9, flat until step 75, then 1 - (step - 75) / 25 down to 0.
    expected = {0: 0.1, 8: 0.9, 9: 1.0, 50: 1.0, 74: 1.0, 75: 1.0, 80: 0.8, 95: 0.2, 99: 0.04, 100: 0.0}
    for step_index, value in expected.items():
        assert lr_at(step_index, config, 100) == pytest.approx(value), step_index


def test_fewer_newton_schulz_steps_orthogonalise_less() -> None:
    """muon_ns_steps reaches torch's Muon: one step of a lone matrix moves it by lr x the
    orthogonalised gradient, whose singular values approach 1 with more iterations."""
    torch.manual_seed(0)
    grad = torch.randn(32, 16)

    def update(ns_steps: int) -> torch.Tensor:
        model = torch.nn.Module()
        model.register_module("transformer", torch.nn.ModuleDict({"h": torch.nn.Linear(16, 32, bias=False)}))
        weight = model.transformer.h.weight
        config = OptimConfig(optimizer="muon", muon_lr=1.0, weight_decay=0.0, muon_momentum=0.0)
        optimizer = build_optimizer(model, dataclasses.replace(config, muon_ns_steps=ns_steps))
        assert optimizer.muon.param_groups[0]["ns_steps"] == ns_steps
        before = weight.detach().clone()
        weight.grad = grad.clone()
        optimizer.step()
        return (before - weight.detach()) / (32 / 16) ** 0.5  # "original" scales lr by sqrt(rows/cols)

    spread = {n: torch.linalg.svdvals(update(n).float()) for n in (1, 5)}
    # One iteration leaves small singular values small; five lift them all into Muon's (0.5, 1.5) band.
    assert spread[1].min() < 0.5 < spread[5].min() and spread[5].max() < 1.5


def test_muon_ns_steps_out_of_range_is_one_line() -> None:
    with pytest.raises(ConfigError, match="muon_ns_steps must be in"):
        OptimConfig(muon_ns_steps=0)
