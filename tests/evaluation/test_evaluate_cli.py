"""evaluate.py end to end, in-process: a model file, a text and local lm-eval tasks give a table and
a JSON file beside the model; each mistake a user can make is one line and exit status 2."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml

from minigpt.checkpoints import save_safetensors
from minigpt.cli.evaluate import evaluate_main
from minigpt.data import CharTokenizer

from .conftest import CHOICES, PROMPTS, TEXTS, bigram_model
from .helpers import TEXT


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A char model whose vocabulary holds every character of the tasks and the text."""
    strings = [TEXT, "\n"] + [d["question"] + " " + " ".join(d["choices"]) for d in CHOICES]
    strings += [d["text"] for d in TEXTS] + [d["prompt"] + d["answer"] for d in PROMPTS]
    tokenizer = CharTokenizer.from_texts(strings)
    path = tmp_path_factory.mktemp("model") / "char.safetensors"
    save_safetensors(bigram_model(tokenizer.n_vocab), tokenizer, path)
    return path


def test_text_and_tasks_give_a_table_and_a_json_file_beside_the_model(
    model_file: Path, tasks: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install -e '.[eval]')")
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    args = ["--checkpoint", str(model_file), "--text", str(text), "--stride", "8"]
    args += ["--tasks", "mini_choice,mini_generate", "--include_path", str(tasks), "--limit", "3"]
    assert evaluate_main(args) == 0
    out, err = capsys.readouterr()
    assert "windows of 16 tokens every 8" in err
    written = model_file.with_name("char.safetensors.evaluation.json")
    document = json.loads(written.read_text())
    assert document["command"].endswith(" ".join(args))
    assert {"python", "minigpt", "torch", "lm_eval"} <= set(document["versions"])
    settings = document["settings"]
    assert settings["text"] | {"source": None} == {
        "source": None,
        "subset": None,
        "tail": 1.0,
        "context_length": 16,
        "stride": 8,
        "tokens": len(TEXT),
        "bytes": len(TEXT),
    }
    assert settings["tasks"]["limit"] == 3 and settings["tasks"]["num_fewshot"] == {
        "mini_choice": 0,
        "mini_generate": 0,
    }
    rows = {(r["task"], r["metric"]): r for r in document["results"]}
    assert set(rows) == {
        ("text", "bits_per_byte"),
        ("text", "token_perplexity"),
        ("mini_choice", "acc"),
        ("mini_choice", "acc_norm"),
        ("mini_generate", "exact_match"),
    }
    assert rows["mini_choice", "acc"]["n"] == 3 and rows["mini_choice", "acc"]["stderr"] is not None
    assert rows["text", "bits_per_byte"]["n"] == len(TEXT)
    # The table: one line per row, with the value as written to the file.
    lines = out.strip().splitlines()
    assert lines[0].split() == ["task", "metric", "value", "stderr", "n"] and len(lines) == 1 + len(rows)
    assert f"{rows['text', 'bits_per_byte']['value']:.4f}" in out
    # A second run does not replace the file unless told to.
    assert evaluate_main(args) == 2
    assert "already exists; pass --force" in capsys.readouterr().err


def mistakes(model_file: Path, tasks: Path, tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    not_a_model = tmp_path / "notes.safetensors"
    not_a_model.write_text("hello")
    missing = tmp_path / "missing_tasks"
    missing.mkdir()
    (missing / "gone.yaml").write_text(
        "task: gone\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'nowhere.jsonl'}\ntest_split: test\noutput_type: loglikelihood_rolling\n"
        'doc_to_text: ""\ndoc_to_target: "{{text}}"\n'
    )
    model = ["--checkpoint", str(model_file), "--out", str(tmp_path / "out.json")]
    local = ["--include_path", str(tasks)]
    return {
        "limit 0": ([*model, *local, "--tasks", "mini_choice", "--limit", "0"], "--limit must be at least 1"),
        "not a model": (["--checkpoint", str(not_a_model), "--text", str(tmp_path)], "notes.safetensors"),
        "nothing to do": (model, "nothing to evaluate"),
        "unknown task": (
            [*model, *local, "--tasks", "mini_choice,no_such_task"],
            "unknown task 'no_such_task'",
        ),
        "data missing": ([*model, "--include_path", str(missing), "--tasks", "gone"], "task gone"),
        "no task folder": (
            [*model, "--include_path", str(tmp_path / "nope"), "--tasks", "x"],
            "is not a folder",
        ),
    }


@pytest.mark.parametrize(
    "mistake", ["limit 0", "not a model", "nothing to do", "unknown task", "data missing"]
)
def test_a_mistake_is_one_line_and_exit_2(
    mistake: str, model_file: Path, tasks: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    if mistake in ("unknown task", "data missing", "no task folder"):
        lm_eval_tasks = pytest.importorskip("lm_eval.tasks", reason="lm-evaluation-harness is not installed")
        # Indexing lm-eval's own 10,000 task files takes seconds; the local folder decides here.
        manager = lm_eval_tasks.TaskManager
        monkeypatch.setattr(
            lm_eval_tasks,
            "TaskManager",
            lambda include_path=None, **_: manager(include_path=include_path, include_defaults=False),
        )
    args, expected = mistakes(model_file, tasks, tmp_path)[mistake]
    assert evaluate_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and expected in err and "\n" not in err, err
    assert not (tmp_path / "out.json").exists()


def test_a_run_folder_is_scored_on_a_text_given(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # Without --text, on its own validation windows: tests/training/test_evaluate_run.py.
    text = tmp_path / "plays.txt"
    text.write_text(TEXT)
    tokenizer = CharTokenizer.from_texts([TEXT])
    model = bigram_model(tokenizer.n_vocab)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    meta = {"gpt": asdict(model.config), "tokenizer": tokenizer.spec()}
    torch.save({"state_dict": state, "minigpt": meta, "global_step": 1}, run / "checkpoints" / "best.ckpt")
    (run / "csv" / "version_0").mkdir(parents=True)
    config = {"data": {"config": {"source": str(text), "tokenizer": "char", "val_fraction": 0.25}}}
    (run / "csv" / "version_0" / "config.yaml").write_text(yaml.safe_dump(config))
    assert evaluate_main(["--checkpoint", str(run), "--text", str(text), "--tail", "0.25"]) == 0
    assert f"text: {text}, last 25% of it" in capsys.readouterr().err
    settings = json.loads((run / "evaluation.json").read_text())["settings"]["text"]
    assert (settings["tail"], settings["bytes"]) == (0.25, round(len(TEXT) * 0.25))
