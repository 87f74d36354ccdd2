import pytest
import torch

from minigpt.model import GPT, ConfigError, GPTConfig
from minigpt.training.config import OptimConfig
from minigpt.training.optim import build_optimizer, build_scheduler, lr_at


def test_weight_decay_applies_to_matrices_only() -> None:
    model = GPT(GPTConfig(vocab_size=40, context_length=8, n_layer=2, n_head=2, n_embd=16))
    optimizer = build_optimizer(model, OptimConfig(weight_decay=0.1))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"])
    assert all(p.dim() == 1 for p in no_decay["params"])
    # Every parameter is optimised exactly once, the tied embedding included.
    ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert ids == {id(p) for p in model.parameters()}
    assert len(ids) == sum(len(g["params"]) for g in optimizer.param_groups)


def test_schedule_warms_up_then_decays_to_min_lr() -> None:
    config = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10)
    lrs = [lr_at(step, config, total_steps=110) for step in range(120)]
    assert lrs[0] == pytest.approx(1 / 11)
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:11], strict=True))  # rising through warmup
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.55)  # halfway through the cosine: the mean of lr and min_lr
    assert all(a >= b for a, b in zip(lrs[10:110], lrs[11:111], strict=True))
    assert lrs[110] == lrs[119] == pytest.approx(0.1)


def test_scheduler_drives_the_optimizer_lr() -> None:
    param = torch.nn.Parameter(torch.zeros(2, 2))
    config = OptimConfig(lr=0.5, min_lr=0.05, warmup_steps=3)
    optimizer = torch.optim.AdamW([param], lr=config.lr)
    scheduler = build_scheduler(optimizer, config, total_steps=20)
    seen = []
    for _ in range(20):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([lr_at(s, config, 20) for s in range(20)])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [(dict(lr=0.0), "lr must be positive"), (dict(min_lr=2.0), "min_lr"), (dict(beta2=1.0), "beta2")],
)
def test_bad_optim_config_names_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        OptimConfig(**kwargs)
