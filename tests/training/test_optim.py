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
    # The values are nanoGPT's schedule worked out by hand, not lr_at's code: warmup rises by
    # lr / (warmup + 1) per step from lr / 11; then lr falls from 1 to min_lr 0.1 along half a
    # cosine over the 100 remaining steps, lr = 0.1 + 0.45 (1 + cos(pi * done / 100)).
    config = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10)
    expected = {
        0: 0.0909091,  # 1 / 11
        4: 0.4545455,  # 5 / 11
        9: 0.9090909,  # 10 / 11
        10: 1.0,
        35: 0.8681981,  # a quarter through: cos(pi / 4) = 0.7071068
        60: 0.55,  # halfway: the mean of lr and min_lr
        85: 0.2318019,  # three quarters: cos(3 pi / 4) = -0.7071068
        109: 0.1002220,  # cos(99 pi / 100) = -0.9995066
        110: 0.1,
        119: 0.1,  # past the end it stays at min_lr
    }
    for step, lr in expected.items():
        assert lr_at(step, config, total_steps=110) == pytest.approx(lr, abs=1e-7), step


def test_scheduler_drives_the_optimizer_lr() -> None:
    param = torch.nn.Parameter(torch.zeros(2, 2))
    config = OptimConfig(lr=0.5, min_lr=0.05, warmup_steps=3)
    optimizer = torch.optim.AdamW([param], lr=config.lr)
    scheduler = build_scheduler(optimizer, config, total_steps=23)
    seen = []
    for _ in range(24):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # Warmup 0.5 x 1/4, 2/4, 3/4; then 0.05 + 0.225 (1 + cos(pi * (step - 3) / 20)).
    assert seen[:4] == pytest.approx([0.125, 0.25, 0.375, 0.5])
    assert seen[8] == pytest.approx(0.4340990, abs=1e-7)  # a quarter of the decay
    assert seen[13] == pytest.approx(0.275)  # halfway
    assert seen[22] == pytest.approx(0.0527701, abs=1e-7)  # cos(19 pi / 20) = -0.9876883
    assert seen[23] == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [(dict(lr=0.0), "lr must be positive"), (dict(min_lr=2.0), "min_lr"), (dict(beta2=1.0), "beta2")],
)
def test_bad_optim_config_names_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        OptimConfig(**kwargs)


def test_embedding_lr_gives_the_tables_their_own_scheduled_rate() -> None:
    """The token and position tables move at embedding_lr (scheduled like lr, with decay); every
    other parameter keeps its group, and without the setting the groups are as before."""
    model = GPT(GPTConfig(vocab_size=40, context_length=8, n_layer=2, n_head=2, n_embd=16, tie_weights=False))
    tables = {id(model.transformer.wte.weight), id(model.transformer.wpe.weight)}
    config = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=0, embedding_lr=3e-2)
    optimizer = build_optimizer(model, config)
    decay, no_decay, embedding = optimizer.param_groups
    assert {id(p) for p in embedding["params"]} == tables
    assert embedding["weight_decay"] == 0.1 and embedding["lr"] == 3e-2
    assert not tables & {id(p) for p in decay["params"] + no_decay["params"]}
    assert id(model.lm_head.weight) in {id(p) for p in decay["params"]}
    scheduler = build_scheduler(optimizer, config, total_steps=10)
    for _ in range(10):
        optimizer.step()
        scheduler.step()
    assert embedding["lr"] == pytest.approx(3e-3) and decay["lr"] == pytest.approx(1e-4)
    assert len(build_optimizer(model, OptimConfig()).param_groups) == 2


def test_embedding_lr_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="embedding_lr must be positive"):
        OptimConfig(embedding_lr=0.0)


def test_parameter_groups_carry_the_names_the_learning_rate_monitor_logs() -> None:
    """LearningRateMonitor logs a group with a "name" as lr-<optimizer>/<name> instead of pg1, pg2:
    the groups are named for what they hold, and the names survive a checkpoint round trip."""
    model = GPT(GPTConfig(vocab_size=40, context_length=8, n_layer=2, n_head=2, n_embd=16, tie_weights=False))

    def names(optimizer: torch.optim.Optimizer) -> list[str]:
        return [group["name"] for group in optimizer.param_groups]

    assert names(build_optimizer(model, OptimConfig())) == ["decay", "no_decay"]
    assert names(build_optimizer(model, OptimConfig(embedding_lr=1e-2))) == [
        "decay",
        "no_decay",
        "embeddings",
    ]
    muon = build_optimizer(model, OptimConfig(optimizer="muon"))
    assert names(muon) == ["muon", "decay", "no_decay"]
    resumed = build_optimizer(model, OptimConfig(optimizer="muon"))
    resumed.load_state_dict(muon.state_dict())
    assert names(resumed) == ["muon", "decay", "no_decay"]
