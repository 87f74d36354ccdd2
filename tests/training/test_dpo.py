"""Preference tuning: the losses against their formulas, the answers' log-probabilities against the
masks, and configs/dpo.yaml through train.py on a tiny model of ours and a toy preference (the sum
of two digits over a wrong sum): the margin rises, the run resumes bit for bit, and its weights
load, export and answer as an SFT model's do."""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path

import pytest
import torch

from minigpt.checkpoints import load_model
from minigpt.checkpoints.load import save_safetensors
from minigpt.cli.export import export_main
from minigpt.cli.train import train_main
from minigpt.data.chat.conversations import IGNORE_INDEX
from minigpt.model import GPT, ConfigError, GPTConfig
from minigpt.training.dpo import REFERENCE_KEY
from minigpt.training.loss import token_losses
from minigpt.training.preference_loss import DPOConfig, answer_logps, preference_losses, reward_stats

from ..cli.helpers import parse
from .conftest import ENV, PROBES, finish, start_script
from .helpers import BASE, assert_identical, last_checkpoint, step_losses


def test_policy_equal_to_reference_gives_ln2_and_a_gradient_to_the_policy_alone() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, context_length=8, n_layer=1, n_head=2, n_embd=16))
    x = torch.randint(0, 11, (4, 8))
    y = torch.randint(0, 11, (4, 8))
    y[:, :3] = IGNORE_INDEX  # the prompt
    with torch.no_grad():
        reference, _ = answer_logps(token_losses(model.features(x), model.lm_head.weight, y).view(4, 8), y)
    policy, _ = answer_logps(token_losses(model.features(x), model.lm_head.weight, y).view(4, 8), y)
    losses, chosen, rejected = preference_losses(
        policy[:2], policy[2:], reference[:2], reference[2:], DPOConfig()
    )
    torch.testing.assert_close(losses, torch.full((2,), math.log(2)))
    assert chosen.abs().max() == rejected.abs().max() == 0
    losses.mean().backward()
    assert not reference.requires_grad  # the reference is numbers, not a second model
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_sigmoid_and_ipo_losses_equal_their_formulas_by_hand() -> None:
    # Summed log-probabilities of two pairs' answers: policy chosen, rejected; reference the same.
    pc, pr, rc, rr = [torch.tensor(v) for v in ([-3.0, -5.0], [-4.0, -2.0], [-3.5, -4.0], [-3.0, -2.5])]
    beta = 0.5
    # TRL's sigmoid loss: -logsigmoid(beta * ((pc - pr) - (rc - rr))).
    h = [(-3.0 - -4.0) - (-3.5 - -3.0), (-5.0 - -2.0) - (-4.0 - -2.5)]  # 1.5, -1.5
    expected = [math.log(1 + math.exp(-beta * value)) for value in h]
    losses, chosen, rejected = preference_losses(pc, pr, rc, rr, DPOConfig(beta=beta))
    torch.testing.assert_close(losses, torch.tensor(expected))
    torch.testing.assert_close(chosen, torch.tensor([0.25, -0.5]))  # beta (pc - rc)
    torch.testing.assert_close(rejected, torch.tensor([-0.5, 0.25]))  # beta (pr - rr)
    stats = reward_stats(chosen, rejected)
    torch.testing.assert_close(stats, torch.tensor([-0.125, -0.125, 0.0, 0.5]))
    # IPO: (h - 1 / (2 beta))^2, here on the same numbers taken as means per token.
    losses, _, _ = preference_losses(pc, pr, rc, rr, DPOConfig(beta=beta, loss_type="ipo"))
    torch.testing.assert_close(losses, torch.tensor([(1.5 - 1.0) ** 2, (-1.5 - 1.0) ** 2]))
    with pytest.raises(ConfigError, match="loss_type"):
        DPOConfig(loss_type="hinge")
    with pytest.raises(ConfigError, match="beta"):
        DPOConfig(beta=0.0)


def test_prompt_and_padding_change_no_answer_log_probability() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, context_length=10, n_layer=1, n_head=2, n_embd=16)).eval()
    x = torch.randint(1, 11, (1, 10))
    y = torch.full((1, 10), IGNORE_INDEX)
    y[0, 3:6] = x[0, 4:7]  # the answer's targets; after them, padding
    padded = x.clone()
    padded[0, 7:] = 0  # other padding ids change nothing: attention is causal

    def logps(ids: torch.Tensor, losses_at_ignored: float = 0.0) -> torch.Tensor:
        losses = token_losses(model.features(ids), model.lm_head.weight, y).view(1, 10)
        losses = torch.where(y == IGNORE_INDEX, losses + losses_at_ignored, losses)
        return answer_logps(losses, y)[0]

    with torch.no_grad():
        torch.testing.assert_close(logps(padded), logps(x), rtol=0, atol=0)
        # The prompt's and padding's own scores count for nothing, whatever they are.
        torch.testing.assert_close(logps(x, losses_at_ignored=7.0), logps(x), rtol=0, atol=0)
        assert answer_logps(torch.ones(1, 10), y)[1].item() == 3


# -- through train.py ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random GPT of ours (char ids, context 48) and 40 pairs: a sum preferred over a wrong one."""
    folder = tmp_path_factory.mktemp("dpo")
    torch.manual_seed(0)
    save_safetensors(
        GPT(GPTConfig(vocab_size=BASE.n_vocab, context_length=48, n_layer=1, n_head=2, n_embd=32)),
        BASE,
        folder / "base.safetensors",
    )
    rng = random.Random(0)
    rows = []
    for _ in range(40):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        wrong = (a + b + rng.randint(1, 5)) % 19
        rows.append({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(wrong)})
    (folder / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder / "base.safetensors", folder / "pairs.jsonl"


def dpo_args(files: tuple[Path, Path], run: Path, *extra: str) -> list[str]:
    weights, pairs = files
    return [
        "--config", "dpo.yaml",
        "--model.init_from", str(weights),
        "--data.pairs.source", str(pairs),
        "--data.pairs.max_pairs", "null",
        "--data.pairs.val_fraction", "0.1",
        "--data.pairs.batch_size", "8",  # 36 pairs: 4 steps an epoch, so step 6 is in mid-epoch
        "--model.optim.lr", "1e-2",
        "--model.optim.warmup_steps", "10",  # every step warms up: a shorter run steps as the longer one
        "--trainer.max_steps", "8",
        "--trainer.val_check_interval", "4",
        "--trainer.log_every_n_steps", "1",
        "--trainer.precision", "32-true",
        "--trainer.accelerator", "cpu",
        "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(run),
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def straight(files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("straight")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setenv("WANDB_MODE", "disabled")
        assert train_main(dpo_args(files, folder / "run")) == 0
    return folder / "run"


def metrics(run: Path) -> list[dict[str, str]]:
    (path,) = run.glob("csv/version_0/metrics.csv")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # trains through train.py
def test_dpo_starts_at_ln2_and_raises_the_margin(straight: Path) -> None:
    rows = metrics(straight)
    train = [row for row in rows if row.get("train_loss")]
    assert float(train[0]["train_loss"]) == pytest.approx(math.log(2), abs=1e-6)  # policy = reference
    assert float(train[0]["rewards/margins"]) == pytest.approx(0, abs=1e-6)
    assert float(train[-1]["rewards/margins"]) > 0.05 and float(train[-1]["rewards/accuracies"]) > 0.5
    assert float(train[-1]["train_loss"]) < math.log(2)
    val = [row for row in rows if row.get("val_loss")]
    # On the held-out pairs too, after 4 steps and after 8.
    assert 0 < float(val[0]["val_rewards/margins"]) < float(val[-1]["val_rewards/margins"])
    assert float(val[-1]["val_loss"]) < float(val[0]["val_loss"]) < math.log(2)
    assert {
        "val_rewards/chosen",
        "val_rewards/rejected",
        "val_rewards/margins",
        "val_rewards/accuracies",
    } <= set(val[-1])
    report = (straight / "report.html").read_text()
    assert "rewards/margins" in report and "val_rewards/accuracies" in report and "perplexity" not in report
    checkpoint = last_checkpoint(straight)
    reference = checkpoint[REFERENCE_KEY]
    assert reference["train"].shape == (36, 2) and reference["val"].shape == (4, 2)
    assert checkpoint["hyper_parameters"]["dpo"] == {"beta": 0.1, "loss_type": "sigmoid"}


@pytest.mark.slow  # trains through train.py
def test_a_dpo_run_that_finished_trains_on_bit_exactly(
    files: tuple[Path, Path], straight: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    finished = tmp_path / "finished"
    assert train_main(dpo_args(files, finished, "--trainer.max_steps", "6")) == 0
    # The resumed run's reference comes from the checkpoint, not from its weights, which moved.
    assert train_main(dpo_args(files, finished, "--ckpt_path", "last")) == 0
    assert step_losses(finished) == step_losses(straight)
    a, b = last_checkpoint(finished), last_checkpoint(straight)
    assert a["global_step"] == b["global_step"] == 8
    for key in ("state_dict", "optimizer_states", "torch_rng_state", REFERENCE_KEY):
        assert_identical(a[key], b[key], key)


@pytest.mark.slow  # two processes through train.py
def test_under_ddp_the_ranks_split_the_reference_and_end_with_one_process_table(
    files: tuple[Path, Path], straight: Path, tmp_path: Path
) -> None:
    run, records = tmp_path / "ddp", tmp_path / "records"
    ddp = ("--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.max_steps", "1")
    count = (f"--trainer.callbacks+={PROBES}.CountReferencePairs", f"--trainer.callbacks.folder={records}")
    result = finish(start_script("train.py", *dpo_args(files, run, *ddp, *count), cwd=tmp_path, env=ENV))
    assert result.returncode == 0, result.stderr[-3000:]
    # 36 training pairs and 4 held out: each rank scores half of them.
    assert [json.loads((records / f"reference{rank}.json").read_text()) for rank in (0, 1)] == [20, 20]
    # And the ranks add their tables into the one a single process makes.
    two, one = last_checkpoint(run)[REFERENCE_KEY], last_checkpoint(straight)[REFERENCE_KEY]
    for split in ("train", "val"):
        torch.testing.assert_close(two[split], one[split], rtol=1e-6, atol=0)


@pytest.mark.slow  # trains through train.py
def test_a_dpo_model_loads_and_exports_as_an_sft_model_does(straight: Path, tmp_path: Path) -> None:
    model, tokenizer = load_model(straight)
    assert tokenizer.decode([BASE.n_vocab]) == "<|system|>"  # the chat markers, as after SFT
    x = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    folder = tmp_path / "hf"
    assert export_main(["--checkpoint", str(straight), "--out", str(folder), "--format", "huggingface"]) == 0
    exported, read_back = load_model(folder)
    assert read_back.spec() == tokenizer.spec()
    with torch.no_grad():
        torch.testing.assert_close(exported.eval()(x), model.eval()(x))


@pytest.mark.slow  # trains through train.py
def test_under_lora_the_reference_is_the_model_with_its_adapters_off(
    files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = tmp_path / "lora"
    lora = ["--model.lora", '{"rank": 4, "targets": ["W_query", "W_value"]}', "--trainer.max_steps", "2"]
    assert train_main(dpo_args(files, run, *lora)) == 0
    # B starts at zero: the adapted model is the weights it started from, which scored the reference.
    assert float(step_losses(run)[0]) == pytest.approx(math.log(2), abs=1e-6)
    reference = last_checkpoint(run)[REFERENCE_KEY]["train"]
    assert reference.shape == (36, 2) and (reference < 0).all()
    assert (run / "adapter" / "adapter_config.json").is_file()


def test_tokens_per_step_counts_both_windows_of_a_pair(files: tuple[Path, Path], tmp_path: Path) -> None:
    # 8 pairs a batch, each a chosen and a rejected window of the weights' 48 tokens: 768 tokens.
    cli = parse(*dpo_args(files, tmp_path / "run", "--tokens_per_step", "1536"))
    assert cli.datamodule.micro_batch() == (768, "8 pairs x 2 windows x 48 tokens")
    assert cli.trainer.accumulate_grad_batches == 2
