import pytest
import torch

from minigpt.model import sample_next, top_k_filter, top_p_filter

LOGITS = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 1.0]])


def test_temperature_zero_is_greedy() -> None:
    assert sample_next(LOGITS, temperature=0).tolist() == [[1], [2]]


def test_top_k_keeps_the_k_largest() -> None:
    kept = torch.isfinite(top_k_filter(LOGITS, 2))
    assert kept.tolist() == [[False, True, True, False], [False, False, True, True]]


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isfinite(top_p_filter(logits, 0.7)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(logits, 0.8)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(logits, 0.81)).tolist() == [[True, True, True, False]]
    # The most likely token always survives, however small p is.
    assert torch.isfinite(top_p_filter(logits, 0.01)).tolist() == [[True, False, False, False]]


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    draws = sample_next(logits, generator=torch.Generator().manual_seed(0)).flatten()
    freq = torch.bincount(draws, minlength=3) / draws.numel()
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.02)


def test_filters_never_sample_outside_the_kept_set() -> None:
    logits = torch.zeros(5000, 10)
    logits[:, 3] = 2.0
    logits[:, 7] = 1.0
    draws = sample_next(logits, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(draws.flatten().tolist()) == {3, 7}


def test_low_temperature_sharpens() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[1.0, 1.5]]).expand(4000, 2)
    cold = sample_next(logits, temperature=0.1, generator=gen).float().mean()
    warm = sample_next(logits, temperature=1.0, generator=gen).float().mean()
    assert cold > 0.99 > warm


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=0), "top_k"),
    ],
)
def test_invalid_settings_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sample_next(LOGITS, **kwargs)
