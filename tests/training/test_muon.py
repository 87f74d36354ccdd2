"""Muon for the blocks' matrices beside AdamW, stepped as one optimizer; the wsd schedule."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from minigpt.model import GPT, ConfigError, GPTConfig
from minigpt.training import precision
from minigpt.training.config import OptimConfig
from minigpt.training.muon import NS_COEFFICIENTS, Muon, newton_schulz, ns_schedule, orthogonalise
from minigpt.training.optim import MuonWithAdamW, build_optimizer, build_scheduler, lr_at

from .helpers import RecordMatmulDtypes, step_both, with_singular_values

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


def test_a_resumed_schedule_still_reaches_both_optimizers() -> None:
    """After load_state_dict the scheduler's groups are the optimizers' own again: a run resumed
    in warmup ramps its learning rates exactly as the run that was never stopped."""
    model = GPT(CONFIG)
    config = OptimConfig(optimizer="muon", warmup_steps=5)
    straight = build_optimizer(model, config)
    straight_schedule = build_scheduler(straight, config, total_steps=20)
    for _ in range(3):
        straight.step()
        straight_schedule.step()
    resumed = build_optimizer(model, config)
    resumed_schedule = build_scheduler(resumed, config, total_steps=20)
    resumed.load_state_dict(copy.deepcopy(straight.state_dict()))
    resumed_schedule.load_state_dict(straight_schedule.state_dict())
    for _ in range(3):
        for optimizer, schedule in ((straight, straight_schedule), (resumed, resumed_schedule)):
            optimizer.step()
            schedule.step()
        for inner in ("muon", "adamw"):
            rates = [[g["lr"] for g in getattr(o, inner).param_groups] for o in (straight, resumed)]
            assert rates[0] == rates[1], inner
    assert all(
        a is b
        for a, b in zip(
            resumed.param_groups, resumed.muon.param_groups + resumed.adamw.param_groups, strict=True
        )
    )


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


# -- our Muon against torch's: the same update, in the precision the device computes fast ----------


def muon_pair(
    ns_dtype: torch.dtype,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.optim.Optimizer, Muon]:
    """The same parameters (square, wide and tall, shapes repeated) under torch's Muon and ours."""
    torch.manual_seed(0)
    shapes = [(16, 16), (16, 16), (48, 16), (16, 48), (16, 48), (8, 24)]
    theirs = [torch.randn(*s, requires_grad=True) for s in shapes]
    ours = [p.detach().clone().requires_grad_() for p in theirs]
    options = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "adjust_lr_fn": "original"}
    return theirs, ours, torch.optim.Muon(theirs, **options), Muon(ours, ns_dtype=ns_dtype, **options)


@pytest.mark.parametrize("ns_dtype", [torch.bfloat16, torch.float32])
def test_our_muon_makes_torchs_update_in_either_precision(ns_dtype: torch.dtype) -> None:
    theirs, ours, torch_muon, our_muon = muon_pair(ns_dtype)
    start = [p.detach().clone() for p in theirs]
    for _ in range(3):
        step_both(theirs, ours, torch_muon, our_muon)
    for before, p, q in zip(start, theirs, ours, strict=True):
        moved = (p - before).abs().max()
        # Within bf16's rounding of the update (3 steps of ~0.02 x unit-scale entries).
        torch.testing.assert_close(q, p, rtol=0, atol=0.02 * moved.item())
        assert not torch.equal(q, before)
    # The state is torch's, buffer for buffer.
    for p, q in zip(theirs, ours, strict=True):
        torch.testing.assert_close(
            our_muon.state[q]["momentum_buffer"], torch_muon.state[p]["momentum_buffer"], rtol=1e-3, atol=1e-4
        )


def test_a_torch_muon_checkpoint_resumes_in_ours_and_ours_in_torchs() -> None:
    """Checkpoints written before our Muon (torch's state dict) keep resuming, and the other way."""
    theirs, ours, torch_muon, our_muon = muon_pair(torch.bfloat16)
    step_both(theirs, ours, torch_muon, our_muon)
    # A third copy of torch's parameters, resumed in ours from torch's state dict, steps as torch's.
    resumed = [p.detach().clone().requires_grad_() for p in theirs]
    resumed_muon = Muon(resumed, lr=0.02, ns_dtype=torch.bfloat16)
    resumed_muon.load_state_dict(copy.deepcopy(torch_muon.state_dict()))
    assert resumed_muon.param_groups[0]["weight_decay"] == 0.1  # the saved groups' options
    grads = [torch.randn_like(p) for p in theirs]
    for p, q, g in zip(theirs, resumed, grads, strict=True):
        p.grad, q.grad = g.clone(), g.clone()
    torch_muon.step()
    resumed_muon.step()
    for p, q in zip(theirs, resumed, strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-3)
    torch.optim.Muon(ours, lr=0.02).load_state_dict(copy.deepcopy(our_muon.state_dict()))


def test_stacked_orthogonalisation_equals_one_matrix_at_a_time_and_is_nearly_orthogonal() -> None:
    torch.manual_seed(0)
    spread = torch.logspace(-1, 1, 32)  # singular values from 0.1 to 10: a gradient's spread
    matrices = [with_singular_values(r, c, spread) for r, c in [(32, 32), (96, 32), (32, 96), (32, 32)]]
    coefficients = [
        (torch.optim._muon.DEFAULT_A, torch.optim._muon.DEFAULT_B, torch.optim._muon.DEFAULT_C)
    ] * 5
    together = orthogonalise(matrices, coefficients, 1e-7, torch.float32)
    for matrix, result in zip(matrices, together, strict=True):
        alone = orthogonalise([matrix], coefficients, 1e-7, torch.float32)[0]
        assert result.shape == matrix.shape and result.dtype == torch.float32
        torch.testing.assert_close(result, alone, rtol=1e-4, atol=1e-5)
        # Muon's quintic pushes every singular value into a band around 1, not exactly to 1...
        singular = torch.linalg.svdvals(result)
        assert 0.5 < singular.min() and singular.max() < 1.5, singular
        # ...and keeps the singular vectors: U V^T of the matrix's SVD, up to that band.
        u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
        assert torch.nn.functional.cosine_similarity((u @ vh).flatten(), result.flatten(), dim=0) > 0.95


@pytest.mark.parametrize("native_bf16", [True, False])
def test_muon_orthogonalises_in_bf16_only_where_the_cpu_multiplies_it_natively(
    native_bf16: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision, "_cpu_has_bf16", lambda: native_bf16)
    expected = torch.bfloat16 if native_bf16 else torch.float32
    _, ours, _, our_muon = muon_pair(ns_dtype=None)
    assert our_muon.orthogonalisation_dtype("cpu") == expected
    for p in ours:
        p.grad = torch.randn_like(p)
    with RecordMatmulDtypes() as record:
        our_muon.step()
    assert record.dtypes == {expected}
    assert "ns_dtype" not in our_muon.state_dict()["param_groups"][0]  # decided where it runs, not saved


@pytest.mark.parametrize("bf16", [True, False])
def test_on_cuda_muon_orthogonalises_in_bf16_where_the_gpu_has_it(
    bf16: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)
    muon = Muon([torch.zeros(4, 4, requires_grad=True)])
    assert muon.orthogonalisation_dtype("cuda") == (torch.bfloat16 if bf16 else torch.float32)
    assert Muon([torch.zeros(4, 4)], ns_dtype=torch.float32).orthogonalisation_dtype("cuda") == torch.float32


def test_the_muon_of_build_optimizer_is_ours() -> None:
    optimizer = build_optimizer(GPT(CONFIG), OptimConfig(optimizer="muon"))
    assert type(optimizer.muon) is Muon


def test_the_gram_iteration_for_wide_matrices_is_the_direct_iteration() -> None:
    """fp32 takes wide matrices through the Gram form; float64's direct iteration is the reference."""
    torch.manual_seed(0)
    stack = torch.randn(3, 16, 64)
    for name in NS_COEFFICIENTS:
        coefficients = ns_schedule(NS_COEFFICIENTS[name], 5)
        gram = newton_schulz(stack, coefficients, 1e-7)  # fp32, 4x as wide as tall: the Gram form
        reference = newton_schulz(stack.double(), coefficients, 1e-7)  # float64: the direct form
        assert gram.dtype == torch.float32
        torch.testing.assert_close(gram.double(), reference, rtol=0, atol=1e-5)
    coefficients = ns_schedule(NS_COEFFICIENTS["jordan"], 5)
    for steps in (1, 2):
        torch.testing.assert_close(
            newton_schulz(stack, coefficients[:steps], 1e-7).double(),
            newton_schulz(stack.double(), coefficients[:steps], 1e-7),
            rtol=0,
            atol=1e-5,
        )


# -- a polynomial per Newton-Schulz step ----------------------------------------------------------


def band(coefficients: list[tuple[float, float, float]], smallest: float = 3e-3) -> tuple[float, float]:
    """Where the singular values in [smallest, 1] end after these steps, in float64."""
    s = torch.logspace(torch.log10(torch.tensor(smallest)), 0, 20001, dtype=torch.float64)
    for a, b, c in coefficients:
        s = a * s + b * s**3 + c * s**5
    return s.min().item(), s.max().item()


def test_polar_express_leaves_the_band_its_comment_states_and_beats_one_polynomial() -> None:
    polar, jordan = NS_COEFFICIENTS["polar_express"], NS_COEFFICIENTS["jordan"]
    three, four, five = (band(ns_schedule(polar, k)) for k in (3, 4, 5))
    assert 0.34 < three[0] and three[1] < 1.66
    assert 0.78 < four[0] and four[1] < 1.21
    assert 0.99 < five[0] and five[1] < 1.01
    # Four of its steps leave a narrower band than five of torch's polynomial (0.68-1.20).
    torchs = band(ns_schedule(jordan, 5))
    assert four[0] > torchs[0] and four[1] - four[0] < torchs[1] - torchs[0]


def test_ns_schedule_repeats_one_triple_and_extends_a_sequence_by_its_last() -> None:
    assert ns_schedule((1.0, 2.0, 3.0), 3) == [(1.0, 2.0, 3.0)] * 3
    per_step = ((1.0, 0.0, 0.0), (2.0, 0.0, 0.0))
    assert ns_schedule(per_step, 1) == [(1.0, 0.0, 0.0)]
    assert ns_schedule(per_step, 3) == [(1.0, 0.0, 0.0), (2.0, 0.0, 0.0), (2.0, 0.0, 0.0)]


def test_a_per_step_schedule_reaches_the_iteration_and_survives_a_checkpoint(tmp_path) -> None:  # noqa: ANN001
    """muon_ns_coefficients reaches Muon: its step is the float64 direct iteration with those
    polynomials, and the group's schedule comes back from a saved state dict (weights only)."""
    torch.manual_seed(0)
    config = OptimConfig(
        optimizer="muon", muon_ns_coefficients="polar_express", muon_ns_steps=3, weight_decay=0.0
    )
    model = GPT(CONFIG)
    optimizer = build_optimizer(model, config)
    optimizer.muon.ns_dtype = torch.float32  # this machine's choice may be bf16: compare in fp32
    weight = model.transformer.h[0].mlp.c_fc.weight  # (64, 16): tall, orthogonalised as its transpose
    before = weight.detach().clone()
    step(model, optimizer)
    momentum = optimizer.muon.state[weight]["momentum_buffer"]
    nesterov = weight.grad.double().lerp(momentum.double(), 0.95)
    expected = newton_schulz(nesterov.T.unsqueeze(0), ns_schedule(NS_COEFFICIENTS["polar_express"], 3), 1e-7)
    lr_scale = (64 / 16) ** 0.5
    moved = (weight.detach() - before).double()
    torch.testing.assert_close(moved, -0.02 * lr_scale * expected[0].T, rtol=0, atol=1e-6)
    torch.save(optimizer.state_dict(), tmp_path / "optim.pt")
    fresh = build_optimizer(GPT(CONFIG), OptimConfig(optimizer="muon"))
    fresh.load_state_dict(torch.load(tmp_path / "optim.pt", weights_only=True))
    group = fresh.muon.param_groups[0]
    assert group["ns_steps"] == 3
    assert ns_schedule(group["ns_coefficients"], 3) == ns_schedule(NS_COEFFICIENTS["polar_express"], 3)


def test_an_unknown_ns_polynomial_is_one_line() -> None:
    with pytest.raises(ConfigError, match="muon_ns_coefficients must be one of jordan, polar_express"):
        OptimConfig(muon_ns_coefficients="chebyshev")


def test_row_blocks_orthogonalise_each_block_as_a_matrix_of_its_own() -> None:
    torch.manual_seed(0)
    spread = torch.logspace(-1, 1, 8)
    split = torch.cat(
        [with_singular_values(8, 32, spread) for _ in range(4)]
    )  # (32, 32), four blocks of 8 rows
    whole = with_singular_values(32, 32, torch.logspace(-1, 1, 32))
    coefficients = ns_schedule(NS_COEFFICIENTS["polar_express"], 5)
    result_split, result_whole = orthogonalise([split, whole], coefficients, 1e-7, torch.float32, [8, None])
    assert result_split.shape == (32, 32) and result_whole.shape == (32, 32)
    for block, result in zip(split.split(8), result_split.split(8), strict=True):
        alone = orthogonalise([block], coefficients, 1e-7, torch.float32)[0]
        torch.testing.assert_close(result, alone, rtol=1e-4, atol=1e-5)
        singular = torch.linalg.svdvals(result)  # each block's rows orthonormal, up to the band
        assert 0.9 < singular.min() and singular.max() < 1.1, singular
    # The blocks together are not an orthogonal matrix: one matrix of their own each.
    assert torch.linalg.svdvals(result_split).max() > 1.2
    torch.testing.assert_close(result_whole, orthogonalise([whole], coefficients, 1e-7, torch.float32)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_look_ahead_computed_into_the_stack_is_the_lerp_orthogonalised(dtype: torch.dtype) -> None:
    """Nesterov's look-ahead written straight into the stacks (wide, tall, square and in row
    blocks, in fp32 or cast to bf16) gives what orthogonalising grad.lerp(momentum) does."""
    torch.manual_seed(0)
    shapes = [(16, 48), (48, 16), (16, 16), (16, 48), (32, 16)]
    momenta = [torch.randn(shape) for shape in shapes]
    grads = [torch.randn(shape) for shape in shapes]
    blocks = [None, None, None, 8, 8]
    coefficients = ns_schedule(NS_COEFFICIENTS["polar_express"], 3)
    looked_ahead = orthogonalise(momenta, coefficients, 1e-7, dtype, blocks, lerp_from=grads, weight=0.95)
    expected = orthogonalise(
        [g.lerp(m, 0.95) for g, m in zip(grads, momenta, strict=True)], coefficients, 1e-7, dtype, blocks
    )
    for result, reference, shape in zip(looked_ahead, expected, shapes, strict=True):
        assert result.shape == shape and result.dtype == dtype
        torch.testing.assert_close(result, reference, rtol=0, atol=0)


def test_a_tall_stack_iterates_on_its_transpose() -> None:
    """Tall matrices are orthogonalised as torch's Muon does them (transposed, iterated, transposed
    back) without being transposed in memory, in the direct and the Gram form."""
    torch.manual_seed(0)
    coefficients = ns_schedule(NS_COEFFICIENTS["polar_express"], 3)
    for rows, cols in ((48, 32), (64, 16)):  # 1.5x: the direct iteration; 4x: the Gram form
        tall = torch.randn(3, rows, cols)
        result = newton_schulz(tall, coefficients, 1e-7)
        assert result.shape == tall.shape and result.is_contiguous()
        reference = newton_schulz(tall.mT.contiguous().double(), coefficients, 1e-7).mT
        torch.testing.assert_close(result.double(), reference, rtol=0, atol=1e-5)


def test_muon_qk_per_head_cuts_queries_and_keys_into_heads_and_leaves_the_state_alone() -> None:
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(CONFIG, qk_norm=True))
    optimizer = build_optimizer(model, OptimConfig(optimizer="muon", muon_qk_per_head=True, weight_decay=0.0))
    optimizer.muon.ns_dtype = torch.float32
    attention = model.transformer.h[1].attn
    head_dim = CONFIG.n_embd // CONFIG.n_head
    blocks = {id(p): rows for p, rows in optimizer.muon.row_blocks.items()}
    expected = {
        id(layer.weight) for block in model.transformer.h for layer in (block.attn.W_query, block.attn.W_key)
    }
    assert set(blocks) == expected and set(blocks.values()) == {head_dim}
    before = attention.W_key.weight.detach().clone()
    step(model, optimizer)
    moved = attention.W_key.weight.detach() - before
    for head in moved.split(head_dim):  # each head's rows moved by an orthogonalised matrix of its own
        singular = torch.linalg.svdvals(head / 0.02)
        assert 0.3 < singular.min() and singular.max() < 1.7, singular
    # What Muon keeps is the same as without the option: checkpoints go either way.
    plain = build_optimizer(GPT(dataclasses.replace(CONFIG, qk_norm=True)), OptimConfig(optimizer="muon"))
    plain.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert plain.state_dict()["muon"]["param_groups"] == optimizer.state_dict()["muon"]["param_groups"]


def test_row_blocks_must_divide_the_matrix() -> None:
    weight = torch.nn.Parameter(torch.randn(12, 8))
    with pytest.raises(ValueError, match="row blocks of 5 rows do not divide a matrix of 12 rows"):
        Muon([weight], row_blocks={weight: 5})


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({}, ""),
        ({"muon_qk_per_head": True}, ", queries and keys per head"),
        ({"muon_v_per_head": True}, ", values per head"),
        (
            {"muon_qk_per_head": True, "muon_v_per_head": True, "muon_ns_norm": "gram"},
            ", scaled by the Gram norm, queries, keys and values per head",
        ),
    ],
)
def test_the_run_summary_says_how_muon_orthogonalises(settings: dict, said: str) -> None:
    model = GPT(CONFIG)
    config = OptimConfig(optimizer="muon", muon_ns_coefficients="polar_express", muon_ns_steps=3, **settings)
    optimizer = build_optimizer(model, config)
    optimizer.muon.ns_dtype = torch.float32
    line = optimizer.describe(torch.device("cpu"))
    assert line == f"Muon orthogonalises in float32 (3 Newton-Schulz steps, polar_express polynomials{said})"


def _reference_iteration(x: torch.Tensor, coefficients: list, scale: torch.Tensor) -> torch.Tensor:
    """The plain Newton-Schulz iteration in float64 on wide matrices, from x / scale."""
    x = x.double() / scale.double()
    for a, b, c in coefficients:
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


def test_the_gram_scaling_divides_by_the_root_of_the_gram_norm_in_every_form() -> None:
    """ns_norm="gram" starts from X / sqrt(||X X^T||_F): the direct iteration, the Gram form and a
    tall stack all give the plain iteration from there."""
    torch.manual_seed(0)
    coefficients = ns_schedule(NS_COEFFICIENTS["polar_express"], 3)
    # Square; the Gram form, wide and tall; the direct iteration, tall.
    for rows, cols in ((24, 24), (16, 64), (64, 16), (48, 32)):
        stack = torch.randn(3, rows, cols) * 1e-3
        result = newton_schulz(stack, coefficients, 1e-7, norm="gram")
        wide = stack if rows <= cols else stack.mT
        scale = torch.linalg.matrix_norm(wide @ wide.mT, keepdim=True).sqrt()
        reference = _reference_iteration(wide, coefficients, scale)
        reference = reference if rows <= cols else reference.mT
        torch.testing.assert_close(result.double(), reference, rtol=0, atol=2e-5)


def test_the_gram_scaling_starts_every_singular_value_nearer_one() -> None:
    """sqrt(||X X^T||_F) lies between the spectral and the Frobenius norm, so every singular value
    starts larger than torch's scaling leaves it, and no larger than 1; after the same steps a
    matrix whose spectrum a few directions dominate (as momentum's) is nearer orthogonal."""
    torch.manual_seed(0)
    spectrum = torch.logspace(0, -3, 32)  # a few large directions, many small
    u, _ = torch.linalg.qr(torch.randn(32, 32, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(128, 32, dtype=torch.float64))
    matrix = (u * spectrum.double()) @ v.mT
    gram_scale = torch.linalg.matrix_norm(matrix @ matrix.mT).sqrt()
    frobenius = torch.linalg.matrix_norm(matrix)
    assert spectrum[0] <= gram_scale < frobenius
    coefficients = ns_schedule(NS_COEFFICIENTS["polar_express"], 3)
    worst = {}
    for norm in ("frobenius", "gram"):
        result = newton_schulz(matrix[None].float(), coefficients, 1e-7, norm=norm)
        worst[norm] = (torch.linalg.svdvals(result.double()) - 1).abs().max()
    assert worst["gram"] < worst["frobenius"], worst


def test_the_gram_scaling_in_bf16_is_float64s_within_bf16s_rounding() -> None:
    """bf16 (the native-bf16 CPUs' and GPUs' precision) takes the direct iteration from the Gram
    matrix of the unscaled stack: float64's result to within bf16's rounding. It rounds more than
    torch's scaling in bf16 (~4.5% of the result's norm against ~2% here): its larger starting
    singular values meet the first polynomial where it is steep. Both are far inside the band
    three steps leave the singular values in (0.35-1.65)."""
    torch.manual_seed(0)
    coefficients = ns_schedule(NS_COEFFICIENTS["polar_express"], 3)
    for shape in ((4, 32, 64), (4, 64, 32)):
        stack = torch.randn(*shape) * 1e-2
        result = newton_schulz(stack.bfloat16(), coefficients, 1e-7, norm="gram")
        assert result.dtype == torch.bfloat16
        reference = newton_schulz(stack.double(), coefficients, 1e-7, norm="gram")
        assert (result.double() - reference).norm() < 0.06 * reference.norm()


def test_the_gram_scaling_leaves_a_zero_matrix_zero() -> None:
    result = newton_schulz(
        torch.zeros(2, 8, 32), ns_schedule(NS_COEFFICIENTS["polar_express"], 3), 1e-7, norm="gram"
    )
    assert torch.equal(result, torch.zeros(2, 8, 32))


def test_an_unknown_ns_norm_is_one_line() -> None:
    with pytest.raises(ConfigError, match="muon_ns_norm must be one of frobenius, gram, got 'spectral'"):
        OptimConfig(optimizer="muon", muon_ns_norm="spectral")
    with pytest.raises(ValueError, match="ns_norm must be one of frobenius, gram"):
        Muon([torch.nn.Parameter(torch.randn(4, 4))], ns_norm="spectral")


def test_muon_v_per_head_cuts_the_values_into_heads_and_the_scaling_leaves_the_state_alone() -> None:
    torch.manual_seed(0)
    model = GPT(CONFIG)
    config = OptimConfig(optimizer="muon", muon_v_per_head=True, muon_ns_norm="gram", weight_decay=0.0)
    optimizer = build_optimizer(model, config)
    optimizer.muon.ns_dtype = torch.float32
    head_dim = CONFIG.n_embd // CONFIG.n_head
    blocks = {id(p): rows for p, rows in optimizer.muon.row_blocks.items()}
    assert blocks == {id(block.attn.W_value.weight): head_dim for block in model.transformer.h}
    values = model.transformer.h[0].attn.W_value
    before = values.weight.detach().clone()
    step(model, optimizer)
    for head in (values.weight.detach() - before).split(head_dim):
        singular = torch.linalg.svdvals(head / 0.02)
        assert 0.3 < singular.min() and singular.max() < 1.7, singular
    # Like the row blocks, the scaling is a choice of the run: checkpoints go either way.
    plain = build_optimizer(GPT(CONFIG), OptimConfig(optimizer="muon"))
    plain.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert plain.state_dict()["muon"]["param_groups"] == optimizer.state_dict()["muon"]["param_groups"]
