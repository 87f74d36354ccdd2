"""Tasks whose data is on a Hugging Face hub that cannot be reached: one line within 5 s naming the
dataset and how to bring it here, not half a minute of retries; local tasks never ask the hub."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install -e '.[eval]')")

import datasets  # noqa: E402
import huggingface_hub.constants  # noqa: E402

from minigpt.checkpoints import save_safetensors  # noqa: E402
from minigpt.cli.evaluate import evaluate_main  # noqa: E402
from minigpt.common import hub  # noqa: E402
from minigpt.data import CharTokenizer  # noqa: E402

from .conftest import CHOICES, bigram_model  # noqa: E402

CLOSED = "http://127.0.0.1:9"
"""Nothing listens on the discard port: the hub there is refused at once."""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A char model that reads `mini_choice`."""
    tokenizer = CharTokenizer.from_texts(
        ["\n"] + [d["question"] + " " + " ".join(d["choices"]) for d in CHOICES]
    )
    path = tmp_path_factory.mktemp("model") / "char.safetensors"
    save_safetensors(bigram_model(tokenizer.n_vocab), tokenizer, path)
    return path


@pytest.fixture
def unreachable_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The hub at a closed port, and empty caches under the Hugging Face home returned."""
    home = tmp_path / "hf-home"
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", CLOSED)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HOME", str(home))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(home / "datasets"))
    hub.hub_unreachable.cache_clear()
    yield home
    hub.hub_unreachable.cache_clear()


def evaluate_offline(args: list[str], capsys: pytest.CaptureFixture) -> tuple[str, float]:
    """evaluate.py's error line, and the seconds it took, where it must fail with status 2."""
    start = time.perf_counter()
    assert evaluate_main(args) == 2
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err, seconds


def test_a_task_on_hub_data_is_one_line_naming_the_dataset_within_5_s(
    model_file: Path, unreachable_hub: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "hub_task.yaml").write_text(
        "task: hub_task\ndataset_path: minigpt-tests/absent\ntest_split: test\n"
        'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: choices\n'
        "doc_to_target: label\nmetric_list:\n  - {metric: acc}\n"
    )
    args = ["--checkpoint", str(model_file), "--include_path", str(folder), "--tasks", "hub_task"]
    err, seconds = evaluate_offline([*args, "--out", str(tmp_path / "out.json")], capsys)
    assert err == (
        "error: task hub_task reads the dataset minigpt-tests/absent from the Hugging Face hub, not in "
        f"this machine's cache ({unreachable_hub}), and the Hugging Face hub ({CLOSED}) cannot be "
        "reached: where a network is, run this evaluation once (--limit 1 will do), then copy that "
        f"machine's Hugging Face cache (~/.cache/huggingface, or $HF_HOME) to {unreachable_hub} here"
    )
    assert seconds < 5.0
    assert not (tmp_path / "out.json").exists()


def test_an_lm_eval_task_is_found_without_its_index_and_fails_within_5_s(
    model_file: Path, unreachable_hub: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Indexing lm-eval's 10,000+ task files alone takes longer than the 5 s.
    args = ["--checkpoint", str(model_file), "--tasks", "hellaswag", "--out", str(tmp_path / "out.json")]
    err, seconds = evaluate_offline(args, capsys)
    assert err.startswith("error: task hellaswag reads the dataset Rowan/hellaswag from the Hugging Face hub")
    assert seconds < 5.0


def test_local_tasks_never_ask_the_hub(
    model_file: Path, tasks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_probe(*args, **kwargs):
        raise AssertionError("the hub was asked about local tasks")

    monkeypatch.setattr(hub, "probe_hub", no_probe)
    hub.hub_unreachable.cache_clear()
    args = ["--checkpoint", str(model_file), "--include_path", str(tasks), "--tasks", "mini_choice"]
    assert evaluate_main([*args, "--out", str(tmp_path / "out.json"), "--bootstrap_iters", "0"]) == 0
    hub.hub_unreachable.cache_clear()
