"""End to end, as a user runs it: train.py with the tiny config, then generate.py from its checkpoint."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from html import unescape
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from minigpt.checkpoints import load_model
from minigpt.cli.generate import generate_main
from minigpt.cli.train import train_main

from ..viz.helpers import png_size
from .conftest import run_script, tiny_args
from .helpers import CHROMIUM, read_metrics

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("train")
    result = run_script("train.py", *tiny_args(corpus, work / "run"), cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    return work / "run"


def test_training_learns_and_writes_checkpoints(trained: Path) -> None:
    assert (trained / "checkpoints" / "last.ckpt").is_file()
    assert (trained / "checkpoints" / "best.ckpt").is_file()
    rows = read_metrics(trained)
    val = [(int(r["step"]), float(r["val_loss"])) for r in rows if r.get("val_loss")]
    assert [step for step, _ in val] == [19, 39]  # val_check_interval 20, max_steps 40
    vocab = load_model(trained)[1].n_vocab
    # Better than uniform guessing over the characters, and better at the end than midway.
    assert val[-1][1] < math.log(vocab) - 1.0
    assert val[-1][1] < val[0][1]
    ppl = [float(r["val_ppl"]) for r in rows if r.get("val_ppl")]
    assert ppl[-1] == pytest.approx(math.exp(val[-1][1]), rel=1e-4)
    assert any(r.get("tokens_per_sec") for r in rows)
    assert any(r.get("lr-AdamW/decay") for r in rows)  # the learning rate under its group's name


def test_checkpoint_records_model_and_tokenizer_and_loads_safely(trained: Path) -> None:
    checkpoint = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    meta = checkpoint["minigpt"]
    assert meta["tokenizer"]["name"] == "char"
    assert meta["gpt"]["n_layer"] == 2 and meta["gpt"]["vocab_size"] == len(meta["tokenizer"]["chars"])
    assert checkpoint["global_step"] == 40
    assert not any("mask" in key for key in checkpoint["state_dict"])
    model, tokenizer = load_model(trained / "checkpoints" / "last.ckpt")
    assert model.config.vocab_size == tokenizer.n_vocab
    assert not model.training


def test_generate_streams_a_continuation_of_the_prompt(trained: Path) -> None:
    result = run_script(
        "generate.py",
        "--checkpoint",
        str(trained),
        "--prompt",
        "ROMEO:",
        "--max_new_tokens",
        "50",
        cwd=trained,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ROMEO:")
    assert len(result.stdout) == len("ROMEO:") + 50 + 1  # one character per token, then a newline


def generated(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """What generate.py prints for `args`, run in this process (no new interpreter to start)."""
    assert generate_main(list(args)) == 0
    return capsys.readouterr().out


def test_generate_is_reproducible_and_cache_does_not_change_tokens(
    trained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--checkpoint", str(trained), "--prompt", "KING", "--max_new_tokens", "80", "--seed", "7"]
    cached = generated(capsys, *args)
    assert cached == generated(capsys, *args) == generated(capsys, *args, "--no_cache")
    assert cached != generated(capsys, *args[:-1], "8")


def test_generate_several_samples(trained: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = generated(capsys, "--checkpoint", str(trained), "--num_samples", "3", "--max_new_tokens", "10")
    assert [line for line in out.splitlines() if line.startswith("--- sample")] == [
        "--- sample 1 ---",
        "--- sample 2 ---",
        "--- sample 3 ---",
    ]


def test_a_new_run_never_overwrites_an_existing_one(
    trained: Path, corpus: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(trained.parent)
    before = (trained / "checkpoints" / "last.ckpt").read_bytes()
    assert train_main(tiny_args(corpus, trained)) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("error: ")
    assert "already holds a run" in err and "--ckpt_path last" in err
    assert (trained / "checkpoints" / "last.ckpt").read_bytes() == before


def test_resume_continues_from_the_saved_step(
    trained: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert train_main(tiny_args(corpus, run, "--ckpt_path", "last", "--trainer.max_steps", "60")) == 0
    resumed = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 60
    # The resumed run started from the saved weights: it wrote a second CSV version whose
    # first logged step follows the saved one.
    rows = read_metrics(run)
    assert min(int(r["step"]) for r in rows) > saved["global_step"]
    assert len(list(run.glob("csv/version_*"))) == 2


PROBE = """<script>
window.addEventListener("load", () => {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.x, r.y + scrollY, r.width, r.height]; };
  const text = (selector) => [...document.querySelectorAll(selector)].map((e) => e.textContent);
  const found = {
    height: document.documentElement.scrollHeight,
    images: [...document.images].map((i) => ({
      alt: i.alt, natural: [i.naturalWidth, i.naturalHeight], box: box(i),
    })),
    headings: text("h2"),
    figures: [...document.querySelectorAll("tr")].map((row) => [...row.children].map((c) => c.textContent)),
    samples: [...document.querySelectorAll(".sample")].map((s) => [s.querySelector("h3").textContent,
                                                                    s.querySelector("pre").textContent]),
    captions: text("figcaption"),
  };
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify(found);
  document.body.append(out);
});
</script>"""
"""Added to a copy of the report: what the browser laid out, measured once every image has loaded."""


def chromium(page: Path, work: Path, *args: str) -> str:
    """Chromium, headless, on `page`: its stdout. Its profile and caches stay in `work`."""
    home = work / "home"
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home), "XDG_CACHE_HOME": str(home)}
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    command += [f"--user-data-dir={work / 'profile'}", "--force-device-scale-factor=1", *args, page.as_uri()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on PATH to render the report in (Debian: apt-get install chromium)"
)
def test_the_report_renders_in_a_browser_with_its_curves_samples_and_attention_maps(
    trained: Path, tmp_path: Path
) -> None:
    """report.html as a browser shows it: every image decodes to its PNG's size and is painted,
    the samples and final figures are on the page."""
    report = trained / "report.html"
    probe = tmp_path / "probe.html"
    probe.write_text(
        report.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8"
    )
    dom = chromium(probe, tmp_path, "--window-size=1280,1000", "--dump-dom")
    match = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert match, dom[-2000:]
    page = json.loads(unescape(match.group(1)))

    assert page["headings"] == [
        "Final figures",
        "Loss curves",
        "Samples over time",
        "Attention maps",
        "Configuration",
    ]
    maps = sorted((trained / "attention").glob("*.png"))
    assert len(maps) == 2  # one per layer of tiny.yaml
    images = page["images"]
    assert [image["alt"] for image in images] == [
        "train and val loss and learning rate against steps",
        *(m.name for m in maps),
    ]
    assert page["captions"] == [m.name for m in maps]
    for image, png in zip(images, [trained / "loss_curves.png", *maps], strict=True):
        assert tuple(image["natural"]) == png_size(png.read_bytes()), image["alt"]  # decoded whole
        width, height = image["box"][2:]  # laid out whole, at the image's aspect ratio
        assert width > 300 and height == pytest.approx(
            width * image["natural"][1] / image["natural"][0], abs=2
        )

    samples = [json.loads(line) for line in (trained / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [20, 40]
    assert page["samples"] == [[f"step {s['step']}", s["text"]] for s in samples]
    figures = dict(page["figures"])
    val = [float(r["val_loss"]) for r in read_metrics(trained) if r.get("val_loss")]
    assert figures["final val loss"] == f"{val[-1]:.4f} at step 40"
    assert figures["steps"] == "40" and figures["tokens seen"] == "40,960"

    # The report itself (no probe) as the browser paints it: every quarter of every image's box
    # holds a picture (an image cut short is painted down to where its data ends).
    shot = tmp_path / "report.png"
    chromium(report, tmp_path, f"--window-size=1280,{page['height']}", f"--screenshot={shot}")
    pixels = (imread(shot)[..., :3] * 255).round().astype(np.uint8)
    assert pixels.shape[:2] == (page["height"], 1280)
    for image in images:
        x, y, width, height = (round(v) for v in image["box"])
        inside = pixels[y + 2 : y + height - 2, x + 2 : x + width - 2]  # within its 1-pixel border
        for quarter in np.array_split(inside, 4):
            colours = len(np.unique(quarter.reshape(-1, 3), axis=0))
            assert colours > 20, f"{image['alt']}: {colours} colours in a quarter of its box"
