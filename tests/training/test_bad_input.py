"""Every mistake a user can make on the command line: one line naming it, exit 2, nothing lost."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from minigpt.cli.train import train_main
from minigpt.model import device

from .conftest import REPO, tiny_args


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err, "nothing on stderr"
    assert err[-1].startswith("error: "), err
    assert not any("Traceback" in line for line in err), err
    return err[-1]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.txt", "does not exist"),
        (lambda d: _write(d / "empty.txt", b""), "empty"),
        (lambda d: _write(d / "short.txt", b"To be, or not to be.\n"), "token"),
        (lambda d: _write(d / "latin1.txt", "Caf\u00e9 au lait\n".encode("latin-1") * 500), "not UTF-8"),
    ],
    ids=["missing", "empty", "shorter-than-a-window", "not-utf8"],
)
def test_bad_datasets(make, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = make(tmp_path)
    assert train_main(tiny_args(source, tmp_path / "run")) == 2
    line = one_error_line(capsys)
    assert message in line, line
    assert not (tmp_path / "run" / "checkpoints").exists()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_context_longer_than_the_machine_can_hold_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever this machine's memory, make it 1 GB: the 40 GB mask of context 200,000 cannot fit.
    monkeypatch.setattr(device, "device_memory", lambda _: 10**9)
    text = _write(tmp_path / "long.txt", b"To be, or not to be: that is the question.\n" * 10_000)
    args = [
        "--data.config.val_fraction",
        "0.5",
        "--model.gpt.context_length",
        "200000",
        "--trainer.accelerator",
        "cpu",  # the message names the device: on a GPU machine tiny.yaml's auto would pick cuda
    ]  # 215k tokens a split
    assert train_main(tiny_args(text, tmp_path / "run", *args)) == 2
    assert one_error_line(capsys) == (
        "error: model context_length 200000: its 200000 x 200000 attention mask needs 40.0 GB, "
        "more than this machine's cpu memory (1.0 GB)"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_unsafe_yaml_tags_are_refused_not_executed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "pwned"
    config = tmp_path / "evil.yaml"
    config.write_text(f'model: !!python/object/apply:os.system ["touch {marker}"]\n')
    assert train_main(["--config", str(config)]) == 2
    assert "evil.yaml" in one_error_line(capsys)
    assert not marker.exists()


@pytest.fixture(scope="module")
def finished_run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short tiny.yaml run to resume from."""
    work = tmp_path_factory.mktemp("finished")
    with pytest.MonkeyPatch.context() as patch:  # in this process: no interpreter to start
        patch.chdir(work)
        patch.setenv("WANDB_MODE", "disabled")
        assert train_main(tiny_args(corpus, work / "run", "--trainer.max_steps", "20")) == 0
    return work / "run"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["--model.gpt.n_layer", "3"], "checkpoint model shape"),
        (["--model.gpt.n_embd", "32"], "checkpoint model shape"),
        pytest.param(
            ["--data.config.tokenizer", "gpt2"], "different tokenizer", marks=pytest.mark.gpt2_ranks
        ),
        (["--model.gpt.gelu_approximate", "tanh"], "trained with gelu_approximate 'none'"),
    ],
)
def test_resuming_with_another_shape_or_tokenizer_is_refused(
    finished_run: Path, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], override, message
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = snapshot(run / "checkpoints")
    args = tiny_args(corpus, run, "--ckpt_path", "last", "--trainer.max_steps", "40", *override)
    assert train_main(args) == 2
    assert message in one_error_line(capsys)
    assert snapshot(run / "checkpoints") == before


@pytest.mark.slow
def test_resuming_a_run_trained_with_a_removed_lever_names_the_commit_that_reads_it(
    finished_run: Path, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    last = run / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    checkpoint["minigpt"]["gpt"]["unet_skips"] = True  # as the model of commit 6352ba0 could be trained
    torch.save(checkpoint, last)
    before = snapshot(run / "checkpoints")
    assert train_main(tiny_args(corpus, run, "--ckpt_path", "last", "--trainer.max_steps", "40")) == 2
    assert one_error_line(capsys) == (
        "error: checkpoint was trained with model.gpt.unet_skips, which minigpt no longer has (its ablation "
        "in benchmarks/RESULTS.md rejected it); commit 6352ba0fea246c09b6ce67c64ad8cdec996f7db4 "
        "still reads it"
    )
    assert snapshot(run / "checkpoints") == before


@pytest.mark.parametrize("callback", ["StopOnNonFinite", "SaveAndStopOnSignal"])
def test_a_read_interval_below_one_is_one_line(
    callback: str, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    config["callbacks"][callback] = {"check_every_n_steps": 0}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    args = tiny_args(corpus, tmp_path / "run", "--trainer.max_steps", "2")
    args[1] = str(path)
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "error: check_every_n_steps must be at least 1, got 0"
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused before anything was written
