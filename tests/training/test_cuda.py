"""Training on a CUDA GPU: Muon orthogonalises in bf16 there and makes torch's update, the
optimizers step the model on the GPU, and train.py runs end to end with `accelerator gpu`.

Skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from minigpt.model import GPT, GPTConfig
from minigpt.training.config import OptimConfig
from minigpt.training.loss import next_token_loss
from minigpt.training.muon import Muon, orthogonalise
from minigpt.training.optim import MuonWithAdamW, build_optimizer

from .conftest import run_script, tiny_args
from .helpers import RecordMatmulDtypes, step_both, with_singular_values

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

COEFFICIENTS = torch.optim._muon.DEFAULT_A, torch.optim._muon.DEFAULT_B, torch.optim._muon.DEFAULT_C
SHAPES = [(256, 256), (256, 256), (1024, 256), (256, 1024), (256, 1024), (128, 384)]
"""Square, tall and wide matrices, shapes repeated, as a model's blocks hold them."""


def test_muon_orthogonalises_in_bf16_and_makes_torchs_update() -> None:
    torch.manual_seed(0)
    theirs = [torch.randn(*s, device="cuda", requires_grad=True) for s in SHAPES]
    ours = [p.detach().clone().requires_grad_() for p in theirs]
    options = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "adjust_lr_fn": "original"}
    torch_muon, our_muon = torch.optim.Muon(theirs, **options), Muon(ours, **options)
    assert our_muon.orthogonalisation_dtype("cuda") == torch.bfloat16
    start = [p.detach().clone() for p in theirs]
    with RecordMatmulDtypes() as record:
        for _ in range(3):
            step_both(theirs, ours, torch_muon, our_muon)
    assert record.dtypes == {torch.bfloat16}  # torch's products and ours, all in bf16
    for before, p, q in zip(start, theirs, ours, strict=True):
        moved = (p - before).abs().max()
        # Within bf16's rounding of the update (3 steps of ~0.02 x unit-scale entries).
        torch.testing.assert_close(q, p, rtol=0, atol=0.02 * moved.item())
        assert not torch.equal(q, before)


def test_bf16_orthogonalisation_on_cuda_is_nearly_orthogonal() -> None:
    torch.manual_seed(0)
    spread = torch.logspace(-1, 1, 128)  # singular values from 0.1 to 10: a gradient's spread
    matrices = [with_singular_values(r, c, spread).cuda() for r, c in [(128, 128), (512, 128), (128, 512)]]
    for matrix, result in zip(
        matrices, orthogonalise(matrices, [COEFFICIENTS] * 5, 1e-7, torch.bfloat16), strict=True
    ):
        assert result.shape == matrix.shape and result.dtype == torch.bfloat16
        singular = torch.linalg.svdvals(result.float())
        assert 0.5 < singular.min() and singular.max() < 1.5, singular
        u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
        assert (
            torch.nn.functional.cosine_similarity((u @ vh).flatten(), result.float().flatten(), dim=0) > 0.95
        )


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_optimizers_fit_one_batch_on_the_gpu_under_bf16_autocast(optimizer: str) -> None:
    """What build_optimizer gives on a GPU (fused AdamW, with Muon for the blocks' matrices)
    trains the model there: a few steps on one batch lower its loss well below chance."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=128, context_length=32, n_layer=2, n_head=2, n_embd=64)
    model = GPT(config).cuda()
    built = build_optimizer(model, OptimConfig(optimizer=optimizer, lr=3e-3, muon_lr=0.02))
    adamw = built.adamw if isinstance(built, MuonWithAdamW) else built
    assert adamw.defaults["fused"] is True
    ids = torch.randint(128, (8, 33), device="cuda")
    losses = []
    for _ in range(30):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = next_token_loss(model(ids[:, :-1]), ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        built.step()
        built.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.5 * math.log(128) < losses[0]


@pytest.mark.slow
def test_train_py_runs_on_the_gpu_in_bf16_with_muon_compiled(corpus: Path, tmp_path: Path) -> None:
    """A few steps of train.py as a GPU user runs it: bf16-mixed, Muon, the compiled network."""
    run = tmp_path / "run"
    gpu = ("--trainer.accelerator", "gpu", "--trainer.precision", "bf16-mixed", "--model.compile", "true")
    short = (
        "--model.optim.optimizer",
        "muon",
        "--trainer.max_steps",
        "6",
        "--trainer.val_check_interval",
        "3",
    )
    result = run_script("train.py", *tiny_args(corpus, run, *gpu, *short), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"on cuda ({torch.cuda.get_device_name()})" in result.stderr
    assert "Muon orthogonalises in bfloat16" in result.stderr
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "checkpoints" / "best.ckpt").is_file()
    assert (run / "report.html").is_file()
    with open(next(run.glob("csv/version_*/metrics.csv"))) as f:
        rows = list(csv.DictReader(f))
    val = [float(r["val_loss"]) for r in rows if r.get("val_loss")]
    assert len(val) == 2 and all(math.isfinite(v) for v in val)
    assert any(r.get("tokens_per_sec") for r in rows)
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert saved["global_step"] == 6
