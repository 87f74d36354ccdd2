"""train.py's settings for several processes: the global batch in tokens, the world size Lightning
finds under torchrun and SLURM, and the refusals, without launching anything."""

from __future__ import annotations

from pathlib import Path

import lightning_utilities.core.rank_zero as utilities_rank_zero
import pytest
import yaml
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.fabric.utilities import rank_zero as fabric_rank_zero
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy
from torch.distributed.fsdp import ShardingStrategy

from minigpt.cli.command import resolve_config_args
from minigpt.cli.train import MiniGPTCLI, train_main
from minigpt.data import TextDataModule
from minigpt.model.gpt import Block
from minigpt.training.lit import LitGPT

from .helpers import parse

CPU = ("--config", "tiny.yaml", "--trainer.accelerator", "cpu")
"""tiny.yaml reads 16 sequences of 64 tokens per process and pass: 1,024 tokens."""

CLUSTER_VARIABLES = (
    "SLURM_NTASKS SLURM_NTASKS_PER_NODE SLURM_NNODES SLURM_PROCID SLURM_LOCALID SLURM_NODEID "
    "SLURM_JOB_NAME SLURM_JOB_ID TORCHELASTIC_RUN_ID WORLD_SIZE RANK LOCAL_RANK GROUP_RANK "
    "LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT"
).split()


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No cluster variables but the ones a test sets; Lightning's rank-zero switch restored after."""
    for name in CLUSTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for module in (fabric_rank_zero, utilities_rank_zero):
        monkeypatch.setattr(module.rank_zero_only, "rank", getattr(module.rank_zero_only, "rank", 0))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    return monkeypatch


@pytest.mark.parametrize(("devices", "accumulate"), [("1", 4), ("2", 2), ("4", 1)])
def test_tokens_per_step_sets_the_accumulation_for_the_number_of_processes(
    devices: str, accumulate: int, cluster: pytest.MonkeyPatch
) -> None:
    strategy = "auto" if devices == "1" else "ddp"
    cli = parse(
        *CPU, "--trainer.devices", devices, "--trainer.strategy", strategy, "--tokens_per_step", "4096"
    )
    assert cli.trainer.world_size == int(devices)
    assert cli.trainer.accumulate_grad_batches == accumulate
    # Lightning counts val_check_interval in batches: validation stays every 20 optimizer steps.
    assert cli.trainer.val_check_interval == 20 * accumulate


def test_without_tokens_per_step_the_accumulation_is_the_configs(cluster: pytest.MonkeyPatch) -> None:
    cli = parse(
        *CPU, "--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.accumulate_grad_batches", "3"
    )
    assert cli.trainer.accumulate_grad_batches == 3


def test_under_slurm_the_world_size_comes_from_its_tasks(cluster: pytest.MonkeyPatch) -> None:
    # What `srun` sets for task 5 of 2 nodes x 4 tasks (configs/slurm/train.sbatch's layout).
    for name, value in {
        "SLURM_NTASKS": "8",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_NNODES": "2",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NAME": "minigpt",
        "SLURM_JOB_ID": "1234",
    }.items():
        cluster.setenv(name, value)
    args = ("--trainer.devices", "4", "--trainer.num_nodes", "2", "--trainer.strategy", "ddp")
    cli = parse(*CPU, *args, "--tokens_per_step", "16384")
    environment = cli.trainer.strategy.cluster_environment
    assert isinstance(environment, SLURMEnvironment)
    assert (cli.trainer.world_size, cli.trainer.global_rank, cli.trainer.local_rank) == (8, 5, 1)
    assert cli.trainer.accumulate_grad_batches == 2  # 16,384 tokens / (1,024 x 8 processes)


def test_under_torchrun_the_world_size_comes_from_its_variables(cluster: pytest.MonkeyPatch) -> None:
    # What `torchrun --nnodes 2 --nproc-per-node 4` sets for the second process of the second node.
    for name, value in {
        "TORCHELASTIC_RUN_ID": "minigpt",
        "WORLD_SIZE": "8",
        "RANK": "5",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        cluster.setenv(name, value)
    args = ("--trainer.devices", "4", "--trainer.num_nodes", "2", "--trainer.strategy", "ddp")
    cli = parse(*CPU, *args, "--tokens_per_step", "16384")
    assert isinstance(cli.trainer.strategy.cluster_environment, TorchElasticEnvironment)
    assert (cli.trainer.world_size, cli.trainer.global_rank, cli.trainer.node_rank) == (8, 5, 1)
    assert cli.trainer.accumulate_grad_batches == 2


@pytest.mark.parametrize(("devices", "strategy"), [("1", SingleDeviceStrategy), ("2", DDPStrategy)])
def test_gpt2_124m_takes_ddp_only_on_several_devices(
    devices: str, strategy: type, cluster: pytest.MonkeyPatch
) -> None:
    # On one GPU, DDP's wrapper copies every gradient into its buckets and splits the compiled
    # graph at them (docs/results/gpu.md).
    cli = parse("--config", "gpt2-124m.yaml", "--trainer.accelerator", "cpu", "--trainer.devices", devices)
    assert type(cli.trainer.strategy) is strategy
    assert cli.trainer.accumulate_grad_batches == 40 // int(devices)


class BuildStrategyOnly(MiniGPTCLI):
    """Parses a config and builds its classes, the strategy among them, but no Trainer: Lightning
    refuses FSDP without a GPU only when the Trainer is built."""

    def instantiate_trainer(self, **kwargs):
        self.strategy = self.config_init.trainer.strategy

    def instantiate_classes(self) -> None:
        LightningCLI.instantiate_classes(self)  # without the checks that need a Trainer


@pytest.mark.parametrize("name", ["gpt2-medium.yaml", "gpt2-large.yaml"])
def test_the_fsdp_configs_build_lightnings_fsdp_strategy(name: str, cluster: pytest.MonkeyPatch) -> None:
    args = resolve_config_args(["--config", name, "--tokens_per_step", "null"])
    cli = BuildStrategyOnly(
        LitGPT, TextDataModule, run=False, args=args, parser_kwargs={"exit_on_error": False}
    )
    strategy = cli.strategy
    assert type(strategy) is FSDPStrategy
    assert strategy.sharding_strategy == ShardingStrategy.FULL_SHARD
    assert strategy._state_dict_type == "sharded"
    # Each transformer block is its own FSDP unit, and its activations are recomputed.
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {Block}
    assert strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {Block}
    assert cli.model.gpt_config.n_layer == {"gpt2-medium.yaml": 24, "gpt2-large.yaml": 36}[name]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--tokens_per_step", "5000"),
            "error: tokens_per_step 5,000 is not a multiple of the 1,024 tokens one pass of every process "
            "reads (16 windows x 64 tokens x 1 process): 4,096 or 5,120 would work",
        ),
        (
            ("--tokens_per_step", "4096", "--trainer.accumulate_grad_batches", "2"),
            "error: trainer.accumulate_grad_batches 2 disagrees with tokens_per_step 4,096, which needs 4",
        ),
        (
            ("--trainer.strategy", "fsdp"),
            "error: trainer: The strategy `fsdp` requires a GPU accelerator, but received "
            "`accelerator='cpu'`",
        ),
        (
            ("--trainer.devices", "8", "--trainer.strategy", "ddp", "--trainer.num_nodes", "2"),
            "error: trainer: You set `devices=8` in Lightning, but the number of tasks per node "
            "configured in SLURM `--ntasks-per-node=4` does not match",
        ),
    ],
    ids=["not-a-multiple", "conflicting-accumulation", "fsdp-on-cpu", "slurm-mismatch"],
)
def test_bad_distributed_settings_get_one_line_and_exit_2(
    args: tuple[str, ...], message: str, cluster: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if "ddp" in args:  # inside a SLURM job of 2 nodes x 4 tasks
        for name, value in {"SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NNODES": "2"}.items():
            cluster.setenv(name, value)
        for name in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"):
            cluster.setenv(name, "0")
        cluster.setenv("SLURM_JOB_NAME", "minigpt")
    assert train_main([*CPU, "--trainer.enable_progress_bar", "false", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(message), err[0]
    assert not Path("runs").exists()  # nothing was written


def test_print_config_shows_tokens_per_step_and_the_accumulation_it_gives(
    cluster: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        train_main([*CPU, "--trainer.devices", "2", "--tokens_per_step", "8192", "--print_config"])
    out = capsys.readouterr().out
    assert yaml.safe_load(out)["tokens_per_step"] == 8192
    assert out.splitlines()[-1] == (
        "# tokens_per_step 8,192 = 16 windows x 64 tokens x 2 processes x accumulate_grad_batches 4 "
        "(set at start)"
    )
