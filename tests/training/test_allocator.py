import functools
import subprocess
import sys

import pytest

from minigpt.training import allocator
from minigpt.training.allocator import M_MMAP_MAX, apply_mallopt, keep_freed_memory

# Page faults over three training steps of a small GPT with a large vocabulary, after two warm-up
# steps: the step allocates and frees ~100 MB of logits and activations each time.
PROBE = """
import resource, sys, torch
from minigpt.training.allocator import M_MMAP_MAX, M_TRIM_THRESHOLD, apply_mallopt, keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
if sys.argv[1] == "nommap":
    assert apply_mallopt({M_MMAP_MAX: 0, M_TRIM_THRESHOLD: (1 << 31) - 1}) == ""
from minigpt.model import GPT, GPTConfig
torch.manual_seed(0)
model = GPT(GPTConfig(vocab_size=8192, context_length=64, n_layer=1, n_head=2, n_embd=64))
opt = torch.optim.AdamW(model.parameters())
x = torch.randint(0, 8192, (16, 64))
def step():
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
step(); step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step(); step(); step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

on_glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is what is tuned")


@functools.cache
def faults_by_mode() -> dict[str, int]:
    """Measured once per session, the three modes at once (each process counts its own faults):
    the default is the baseline of both tests below."""
    # A fresh process each, as train.py is: the setting must come before the process's big allocations.
    probes = {
        mode: subprocess.Popen([sys.executable, "-c", PROBE, mode], stdout=subprocess.PIPE, text=True)
        for mode in ("default", "tuned", "nommap")
    }
    counts = {}
    for mode, probe in probes.items():
        out = probe.communicate(timeout=120)[0]
        assert probe.returncode == 0, f"the {mode} probe failed"
        counts[mode] = int(out.split()[-1])
    return counts


def step_faults(mode: str) -> int:
    return faults_by_mode()[mode]


@pytest.mark.slow
@on_glibc
def test_training_steps_stop_page_faulting_their_buffers_in() -> None:
    default, tuned = step_faults("default"), step_faults("tuned")
    assert default > 10_000  # each step maps and faults in its big buffers again
    # Tuned, the heap keeps its pages: a few reallocations still fault, never most of a step.
    assert tuned < default / 4


@pytest.mark.slow
@on_glibc
def test_other_settings_go_through_the_same_path() -> None:
    # The benchmark's "nommap" variant: never mmap, never trim. It keeps pages as "tuned" does.
    assert step_faults("nommap") < step_faults("default") / 4


@on_glibc
def test_apply_mallopt_names_what_glibc_rejects() -> None:
    m_mxfast = 1  # glibc rejects a fast-bin limit above 160 bytes and leaves the setting as it was
    assert apply_mallopt({}) == ""
    assert apply_mallopt({m_mxfast: 1 << 20}) == "mallopt rejected parameters [1]"


def test_without_glibc_nothing_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert apply_mallopt({}) == ""  # nothing asked, nothing missing
    assert "no glibc" in apply_mallopt({M_MMAP_MAX: 0})
    assert keep_freed_memory() is False


@on_glibc
def test_keep_freed_memory_warns_when_glibc_refuses(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(allocator, "SETTINGS", {1: 1 << 20})  # M_MXFAST out of range: rejected
    assert keep_freed_memory() is False
    assert "rejected parameters [1]" in caplog.text
