import subprocess
import sys

import pytest

# Faults taken while allocating and filling a second 64 MiB tensor after a first one was freed.
PROBE = """
import resource, sys, torch
from minigpt.training.allocator import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(64 * 1024 * 1024 // 4)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()
print(faults())
"""


def second_buffer_faults(mode: str) -> int:
    # A fresh process, as train.py is: the setting must come before the process's big allocations.
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is what is tuned")
def test_freed_buffers_are_reused_without_page_faults() -> None:
    # By default glibc unmaps the freed buffer and the next one faults in all 16,384 of its pages;
    # tuned, the heap keeps them.
    assert second_buffer_faults("default") > 10_000
    assert second_buffer_faults("tuned") < 1_000
