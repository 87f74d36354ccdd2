"""The fp32 fallback for real: a bf16 run on a CPU that multiplies bf16 only by emulation trains in
fp32, Muon's orthogonalisation included, and ends well; where the CPU has native bf16, it stays bf16.

oneDNN's bf16 check is what train.py asks. On a CPU with native bf16 (AVX512-BF16 or AMX),
`ONEDNN_MAX_CPU_ISA=AVX2` makes that check say no, as on an AVX2-only CPU, so both cases run on
either kind of CPU.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minigpt.training import precision

from .conftest import REPO, tiny_args

AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
"""Makes oneDNN's bf16 check say no on a CPU with native bf16."""
FALLBACK = "training in fp32 instead of bf16-mixed"


def cpu_flags() -> set[str] | None:
    """The CPU's flags in /proc/cpuinfo; None where there is no such file."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return None


def start_train(corpus: Path, run: Path, env: dict[str, str | None]) -> subprocess.Popen[str]:
    """train.py from `run`'s parent: tiny.yaml asking for bf16-mixed and Muon, 3 steps on the CPU."""
    args = tiny_args(corpus, run, "--trainer.precision", "bf16-mixed", "--model.optim.optimizer", "muon")
    args += ["--trainer.max_steps", "3", "--trainer.accelerator", "cpu"]
    # No GPU: the precision is decided for the CPU, as on a machine without one.
    full = {**os.environ, "WANDB_MODE": "disabled", "CUDA_VISIBLE_DEVICES": "", **env}
    run.parent.mkdir(parents=True)
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=run.parent,
        env={key: value for key, value in full.items() if value is not None},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def assert_trained(run: Path, console: str, returncode: int, precision: str, muon: str) -> None:
    """The run ended well, 3 steps in `precision` on the CPU, with Muon orthogonalising in `muon`."""
    assert returncode == 0, console[-3000:]
    assert f"; {precision} on cpu (" in console and f"Muon orthogonalises in {muon} (" in console, console
    assert (FALLBACK in console) is (precision == "32-true"), console
    assert "done: 3 steps" in console
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3


def test_the_bf16_check_agrees_with_the_cpu_flags() -> None:
    """train.py asks oneDNN; /proc/cpuinfo's flags are the independent word on the same question:
    yes with AVX512-BF16 or AMX (Zen 4, recent Xeons), no without AVX-512 (Zen 3, most laptops).
    AVX-512 CPUs without bf16 (older Xeons) are oneDNN's own call, not checked here."""
    flags = cpu_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    if os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("ATEN_CPU_CAPABILITY"):
        pytest.skip("oneDNN or ATen is held to an instruction set here, so the flags do not decide")
    if {"avx512_bf16", "amx_bf16"} & flags:
        assert precision._onednn_bf16()
    elif "avx512f" not in flags:
        assert not precision._onednn_bf16() and not precision._cpu_has_bf16()
    else:
        pytest.skip("AVX-512 without bf16: whether oneDNN counts it as bf16 is its own decision")


@pytest.mark.parametrize(
    ("onednn", "bf16_speed", "expected", "said"),
    [
        (True, 2.5, "bf16-mixed", None),  # a Zen 4: bf16 products 2-3x fp32's
        (True, 0.5, "32-true", "this CPU multiplies bf16 at 0.50x fp32's speed"),  # reported, yet slower
        (True, 1.1, "32-true", "this CPU multiplies bf16 at 1.10x fp32's speed"),  # too little to gain
        (False, None, "32-true", "this CPU has no native bf16"),  # AVX2 only: not even measured
    ],
)
def test_a_cpu_trains_in_bf16_only_where_it_measures_faster(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    onednn: bool,
    bf16_speed: float | None,
    expected: str,
    said: str | None,
) -> None:
    def speeds(dtypes: tuple[torch.dtype, ...]) -> list[float]:
        assert onednn, "a CPU without bf16 is not measured"
        return [bf16_speed if dtype == torch.bfloat16 else 1.0 for dtype in dtypes]

    monkeypatch.delenv(precision.CPU_BF16, raising=False)  # the suite pins it (tests/conftest.py)
    monkeypatch.setattr(precision, "_onednn_bf16", lambda: onednn)
    monkeypatch.setattr(precision, "product_speeds", speeds)
    precision.bf16_gain.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="minigpt"):
            assert precision.resolve_precision("bf16-mixed", "cpu") == expected
        assert precision.fast_matmul_dtype("cpu") == (
            torch.bfloat16 if expected == "bf16-mixed" else torch.float32
        )
        if said is None:
            assert caplog.text == "" and precision.cpu_description().endswith(", native bf16")
        else:
            assert f"{said}; training in fp32 instead of bf16-mixed" in caplog.text
    finally:
        precision.bf16_gain.cache_clear()  # measured again, for real, by the next caller


@pytest.mark.parametrize(("told", "expected"), [("1", "bf16-mixed"), ("0", "32-true")])
def test_the_environment_can_overrule_the_measurement(
    monkeypatch: pytest.MonkeyPatch, told: str, expected: str
) -> None:
    monkeypatch.setenv(precision.CPU_BF16, told)
    monkeypatch.setattr(precision, "_onednn_bf16", lambda: True)
    monkeypatch.setattr(precision, "product_speeds", lambda dtypes: pytest.fail("measured though told"))
    precision.bf16_gain.cache_clear()
    try:
        assert precision.resolve_precision("bf16-mixed", "cpu") == expected
    finally:
        precision.bf16_gain.cache_clear()


def test_the_measurement_of_bf16_against_fp32_takes_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(precision.CPU_BF16, raising=False)  # the suite pins it (tests/conftest.py)
    precision.bf16_gain.cache_clear()
    start = time.perf_counter()
    gain = precision.bf16_gain()
    assert time.perf_counter() - start < 1.0
    assert gain == 0.0 if not precision._onednn_bf16() else gain > 0.0


@pytest.mark.slow
def test_a_bf16_run_trains_in_fp32_where_bf16_is_emulated(corpus: Path, tmp_path: Path) -> None:
    """The other case, the CPU as it is, is every other run of the suite's: the headline runs
    (test_headline.py) and the resume tests (test_resume.py) check the precision and Muon's
    against what this machine's own bf16 check says, in bf16 or in fp32."""
    run = tmp_path / "avx2" / "run"
    emulated = start_train(corpus, run, AVX2_ONLY)
    out = emulated.communicate(timeout=240)[0]
    assert_trained(run, out, emulated.returncode, "32-true", "float32")
    assert "no native bf16" in out  # the run summary's CPU description agrees


@pytest.mark.parametrize(
    ("accelerator", "cpu_bf16", "expected"),
    [
        ("cpu", False, "32-true"),  # a run kept on the CPU of a machine with a GPU: the CPU decides
        ("cpu", True, "bf16-mixed"),
        ("gpu", False, "bf16-mixed"),  # the GPU computes bf16 natively, whatever the CPU
        ("auto", False, "bf16-mixed"),  # `auto` takes the GPU
    ],
)
def test_the_precision_is_decided_by_the_device_the_run_trains_on(
    monkeypatch: pytest.MonkeyPatch, accelerator: str, cpu_bf16: bool, expected: str
) -> None:
    """On a machine with a bf16 GPU, whose CPU has no native bf16."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(precision, "_cpu_has_bf16", lambda: cpu_bf16)
    assert precision.resolve_precision("bf16-mixed", accelerator) == expected
