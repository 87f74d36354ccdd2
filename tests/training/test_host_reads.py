"""A training step leaves the device alone: between the steps that log, nothing reads a tensor's
value on the host. On a GPU each such read makes the host wait until the device has run all the
work queued so far, so the next step's kernels start late; on a CPU the same code runs, so the
reads can be counted here."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from minigpt.cli.train import train_main
from minigpt.cli.train_defaults import expanded

from .conftest import REPO, tiny_args

LOG_EVERY = 5


def test_steps_between_logs_read_nothing_on_the_host(corpus: Path, tmp_path: Path) -> None:
    config = expanded(yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text()))
    callbacks = config["trainer"]["callbacks"]
    for callback in callbacks:
        if callback["class_path"].endswith("StopOnNonFinite"):  # as on a GPU: read at the log steps
            callback["init_args"] = {"check_every_n_steps": LOG_EVERY}
    # The shipped callbacks that act at every step: the weight average and the progress bar.
    callbacks.append({"class_path": "minigpt.training.callbacks.averaging.EMAWeights"})
    callbacks.append(
        {"class_path": "tests.training.probes.CountHostReads", "init_args": {"folder": str(tmp_path)}}
    )
    config["trainer"].update(log_every_n_steps=LOG_EVERY, max_steps=30, val_check_interval=15)
    config["model"]["optim"].update(optimizer="muon", grad_clip=1.0)
    path = tmp_path / "steps.yaml"
    path.write_text(yaml.safe_dump(config))
    args = tiny_args(corpus, tmp_path / "run", "--trainer.enable_progress_bar", "true")
    args[1] = str(path)
    assert train_main(args) == 0
    reads = {
        int(step): where for step, where in json.loads((tmp_path / "host_reads.json").read_text()).items()
    }
    quiet = {step: where for step, where in reads.items() if step % LOG_EVERY and (step - 1) % LOG_EVERY}
    assert len(quiet) >= 10, reads  # the test saw the steps it is about
    assert all(not where for where in quiet.values()), quiet
    assert any(reads[step] for step in reads if step % LOG_EVERY == 0)  # the count works: log steps read
