import subprocess
import sys

import pytest

# Page faults over three training steps of a small GPT with a large vocabulary, after two warm-up
# steps: the step allocates and frees ~100 MB of logits and activations each time.
PROBE = """
import resource, sys, torch
from minigpt.training.allocator import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
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


def step_faults(mode: str) -> int:
    # A fresh process, as train.py is: the setting must come before the process's big allocations.
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is what is tuned")
def test_training_steps_stop_page_faulting_their_buffers_in() -> None:
    default, tuned = step_faults("default"), step_faults("tuned")
    assert default > 10_000  # each step maps and faults in its big buffers again
    # Tuned, the heap keeps its pages: a few reallocations still fault, never most of a step.
    assert tuned < default / 4
