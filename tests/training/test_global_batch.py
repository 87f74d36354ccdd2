"""tokens_per_step: the global batch in tokens, from which gradient accumulation follows."""

from __future__ import annotations

import pytest

from minigpt.common import UsageError
from minigpt.data.config import micro_batch
from minigpt.training.global_batch import accumulation_for, planned_accumulation

WINDOWS_16_64 = micro_batch(16, 64)  # 16 windows of 64 tokens: 1,024 tokens a pass


@pytest.mark.parametrize(
    ("world_size", "accumulate"),
    [(1, 32), (2, 16), (8, 4), (32, 1)],
)
def test_the_same_global_batch_on_any_number_of_processes(world_size: int, accumulate: int) -> None:
    # 16 sequences of 64 tokens per process and pass: 1,024 tokens; 32,768 tokens per step.
    assert accumulation_for(32_768, WINDOWS_16_64, world_size) == accumulate


def test_a_global_batch_that_does_not_divide_names_the_values_that_would() -> None:
    with pytest.raises(UsageError) as err:
        accumulation_for(5_000, WINDOWS_16_64, 2)  # one pass of both processes: 2,048 tokens
    message = str(err.value)
    assert "tokens_per_step 5,000 is not a multiple of the 2,048 tokens" in message
    assert "(16 windows x 64 tokens x 2 processes)" in message
    assert "4,096 or 6,144 would work" in message


def test_a_global_batch_smaller_than_one_pass_is_refused() -> None:
    with pytest.raises(UsageError, match=r"2,048 \(or a smaller batch\) would work"):
        accumulation_for(1_024, WINDOWS_16_64, 2)
    with pytest.raises(UsageError, match="must be positive"):
        accumulation_for(0, WINDOWS_16_64, 1)


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
    assert expected in planned_accumulation(32_768, WINDOWS_16_64, devices, num_nodes)


def test_a_pair_counts_its_two_windows() -> None:
    # Preference data reads a chosen and a rejected window a pair: 8 pairs of 64 hold 1,024 tokens.
    pairs = micro_batch(8, 64, ("pairs", 2))
    assert pairs == (1_024, "8 pairs x 2 windows x 64 tokens")
    assert accumulation_for(32_768, pairs, 1) == 32
    assert "= 8 pairs x 2 windows x 64 tokens x 2 processes x accumulate_grad_batches 16" in (
        planned_accumulation(32_768, pairs, 2, 1)
    )
