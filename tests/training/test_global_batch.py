"""tokens_per_step: the global batch in tokens, from which gradient accumulation follows."""

from __future__ import annotations

import pytest

from minigpt.common import UsageError
from minigpt.training.global_batch import accumulation_for, planned_accumulation


@pytest.mark.parametrize(
    ("world_size", "accumulate"),
    [(1, 32), (2, 16), (8, 4), (32, 1)],
)
def test_the_same_global_batch_on_any_number_of_processes(world_size: int, accumulate: int) -> None:
    # 16 sequences of 64 tokens per process and pass: 1,024 tokens; 32,768 tokens per step.
    assert accumulation_for(32_768, 16, 64, world_size) == accumulate


def test_a_global_batch_that_does_not_divide_names_the_values_that_would() -> None:
    with pytest.raises(UsageError) as err:
        accumulation_for(5_000, 16, 64, 2)  # one pass of both processes: 2,048 tokens
    message = str(err.value)
    assert "tokens_per_step 5,000 is not a multiple of the 2,048 tokens" in message
    assert "batch 16 x context 64 x 2 processes" in message
    assert "4,096 or 6,144 would work" in message


def test_a_global_batch_smaller_than_one_pass_is_refused() -> None:
    with pytest.raises(UsageError, match=r"2,048 \(or a smaller batch\) would work"):
        accumulation_for(1_024, 16, 64, 2)
    with pytest.raises(UsageError, match="must be positive"):
        accumulation_for(0, 16, 64, 1)


@pytest.mark.parametrize(
    ("devices", "num_nodes", "expected"),
    [
        (2, 1, "x 2 processes x accumulate_grad_batches 16"),
        ("8", 2, "x 16 processes x accumulate_grad_batches 2"),
        ([0, 1, 2, 3], 1, "x 4 processes x accumulate_grad_batches 8"),
        ("auto", 1, "follows from the number of processes, known at start (devices 'auto')"),
    ],
)
def test_print_config_says_what_the_accumulation_will_be(devices, num_nodes: int, expected: str) -> None:
    assert expected in planned_accumulation(32_768, 16, 64, devices, num_nodes)
