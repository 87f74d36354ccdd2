"""Every command of README and the guides in docs/, checked as written; the training guide's examples
of adding a callback run on tiny.yaml.

A command is a line of a fenced `bash` block (backslash continuations joined, `&&` chains split), or
an inline `python <entry point>.py ...` span. Each is checked as far as it can be here, offline, on a
CPU, in seconds, without running twice what another test already runs (test_headline runs README's
main job, the cli tests each entry point's work):

- an entry point (`train.py`, `generate.py`, ...; also under torchrun and in the SLURM script): its
  options parse as written, with every check a parse makes (types, choices, the options' own
  `__post_init__`); `train.py` prints its config, which also takes a fine-tune's shape from its weights;
- the set-up and test commands: CI (`.ci/run`) installs the same way and runs the same test command,
  and the extras and markers they name exist;
- `python -c`: it compiles, and every name it imports exists;
- `curl` to the server: its JSON is a request the server's own model accepts;
- `hf download`: the `hf` command is installed; what it would fetch is stood in for by GPT-2 124M's
  `config.json`, all a fine-tune's options need to parse. Likewise the run a command fine-tunes
  (`runs/small` and `runs/sft`, which `small.yaml` and `sft.yaml` write) is stood in for by a
  checkpoint that describes a model and holds no weights.

Commands for GPUs, several nodes or a hub download are checked the same way: parsing needs neither.
A command no rule knows fails, so a new kind of command needs a check here.
"""

from __future__ import annotations

import ast
import csv
import importlib
import importlib.util
import json
import re
import shlex
from importlib.metadata import entry_points, metadata
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason

from minigpt.checkpoints import MODEL_KEY, describe
from minigpt.cli.train import train_main
from minigpt.data import CharTokenizer
from minigpt.model import GPTConfig

from ..training.conftest import REPO, make_play, tiny_args
from ..training.helpers import read_metrics

GUIDES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
"""README and the guides; the results pages under docs/results/ hold benchmark commands, not these."""

TEXT = "\n".join(path.read_text() for path in GUIDES)

ENTRY_POINTS = (
    "train",
    "generate",
    "chat",
    "evaluate",
    "export",
    "visualize",
    "report",
    "serve",
    "train_tokenizer",
    "play_questions",
)
"""The scripts at the repository root; `<name>.py` runs `minigpt.cli.<name>.<name>_main`."""

GPT2_124M = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12}
"""GPT-2 124M's config.json, as `hf download gpt2` writes it (n_head 12 is GPT-2's default)."""

FROZEN = ("--model.optim.lr", "1e-30", "--model.optim.min_lr", "0", "--trainer.val_check_interval", "1")
"""Updates of 1e-30 leave every weight as it is, so no validation loss improves on the first one;
a validation after every step."""

SMALL = ("--model.gpt.n_layer", "1", "--model.gpt.n_head", "1", "--trainer.limit_val_batches", "1")
"""One layer of one head, one validation batch: the attention maps drawn at every validation are
most of such a run's time."""


def shell_commands(line: str) -> list[list[str]]:
    """The commands of one shell line, split at `&&`, comments dropped."""
    commands: list[list[str]] = [[]]
    for word in shlex.split(line, comments=True):
        if word == "&&":
            commands.append([])
        else:
            commands[-1].append(word)
    return [command for command in commands if command]


def guide_commands() -> dict[tuple[str, ...], str]:
    """Every command of README and the guides, each once, with the file it is first in."""
    found: dict[tuple[str, ...], str] = {}
    for path in GUIDES:
        text = path.read_text()
        lines = [
            line
            for block in re.findall(r"```bash\n(.*?)```", text, re.S)
            for line in block.replace("\\\n", " ").splitlines()
        ]
        scripts = "|".join(ENTRY_POINTS)
        lines += [
            " ".join(span.split())
            for span in re.findall(rf"`(python (?:{scripts})\.py\b[^`]*)`", text)
            if "..." not in span
        ]
        for line in lines:
            for command in shell_commands(line):
                found.setdefault(tuple(command), path.relative_to(REPO).as_posix())
    return found


COMMANDS = guide_commands()


class Parsed(Exception):
    """Raised in place of an entry point's work, once its options have parsed."""


def parse_entry_point(script: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """Parse `args` as `script` would, and stop before it does anything; what it printed."""
    name = script.removesuffix(".py")
    assert name in ENTRY_POINTS, f"{script} is not an entry point"
    if name == "train":  # LightningCLI parses in its constructor: --print_config stops it there
        args = args if "--help" in args else [*args, "--print_config"]
        main = train_main
    else:
        module = importlib.import_module(f"minigpt.cli.{name}")
        parse = module.parse_options

        def parse_and_stop(*a, **kw):
            raise Parsed(parse(*a, **kw))

        monkeypatch.setattr(module, "parse_options", parse_and_stop)
        main = getattr(module, f"{name}_main")
    try:
        code = main(args)
    except (SystemExit, Parsed) as stopped:
        code = stopped.code if isinstance(stopped, SystemExit) else 0
    assert code == 0, f"{script} {shlex.join(args)} did not parse (exit {code})"
    return name


def ci_script() -> str:
    return (REPO / ".ci" / "run").read_text()


def check_setup(command: list[str]) -> None:
    """README's set-up commands are CI's, which installs from scratch the same way."""
    ci = ci_script()
    match command:
        case ["python", "-m", "venv", _]:
            assert "-m venv" in ci
        case [".", activate]:
            assert activate.endswith("bin/activate") and "bin/activate" in ci
        case ["pip", "install", requirement] if "==" in requirement:
            assert f"pip install --quiet {requirement}" in ci, f"CI does not install {requirement}"
        case ["pip", "install", "-e", extras]:
            wanted = set(re.fullmatch(r"\.\[(.*)\]", extras).group(1).split(","))
            assert wanted <= set(metadata("minigpt").get_all("Provides-Extra")), extras
            if extras == ".[dev]":
                assert '-e ".[dev]"' in ci
        case _:
            pytest.fail(f"no check for {shlex.join(command)}")


def check_pytest(args: list[str], config: pytest.Config) -> None:
    """README's test command is the one CI runs; a marker a command selects on is declared."""
    declared = {marker.split(":")[0] for marker in config.getini("markers")}
    match args:
        case []:
            assert re.search(r"^python -m pytest$", ci_script(), re.M), "CI runs another test command"
        case ["-m", expression]:
            assert set(expression.split()) - {"not", "and", "or"} <= declared, expression
        case ["-n", workers, *paths]:
            assert workers.isdigit() and paths, args
            assert all((REPO / path).exists() for path in paths), paths
        case _:
            pytest.fail(f"no check for pytest {shlex.join(args)}")


def check_python_code(code: str) -> None:
    """`python -c` code compiles, and every name it imports exists (minigpt's are imported)."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom):
            if node.module.split(".")[0] == "minigpt":
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"
            else:
                assert importlib.util.find_spec(node.module) is not None, node.module
    compile(code, "<-c>", "exec")


def check_request(args: list[str]) -> None:
    """A `curl` to the server sends a request its own request model accepts."""
    from minigpt.server.protocol import ChatRequest, CompletionRequest

    (url,) = [arg for arg in args if arg.startswith("http")]
    body = json.loads(args[args.index("-d") + 1])
    model = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatRequest}[
        re.sub(r"^https?://[^/]+", "", url)
    ]
    model.model_validate(body)


def slurm_command(script: Path, extra: list[str]) -> list[str]:
    """The train.py command `sbatch script extra...` runs, SLURM's variables as its header sets them."""
    text = script.read_text()
    env = {
        "SLURM_NNODES": re.search(r"^#SBATCH --nodes=(\d+)", text, re.M).group(1),
        "SLURM_NTASKS_PER_NODE": re.search(r"^#SBATCH --ntasks-per-node=(\d+)", text, re.M).group(1),
    }
    (line,) = [line for line in text.replace("\\\n", " ").splitlines() if line.startswith("srun ")]
    words = [word for word in shlex.split(re.sub(r'"\$(\w+)"', lambda m: env[m.group(1)], line))]
    assert words[-1] == "$@"
    return words[1:-1] + extra


@pytest.mark.parametrize(
    "command", [list(command) for command in COMMANDS], ids=[" ".join(c) for c in COMMANDS]
)
def test_every_command_of_readme_and_the_guides_is_valid_as_written(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.chdir(tmp_path)  # run folders the commands name are looked for here
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for download in [c for c in COMMANDS if c[:2] == ("hf", "download")]:
        folder = tmp_path / download[download.index("--local-dir") + 1]
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(GPT2_124M))
    for run in ("small", "sft"):  # what small.yaml and sft.yaml write, which sft.yaml and dpo.yaml read
        stand_in_run(tmp_path / "runs" / run)
    match command:
        case ["python", "-m", "pytest", *args]:
            check_pytest(args, request.config)
        case ["python", "-c", code]:
            check_python_code(code)
        case ["python", script, *args] if script.endswith(".py"):
            parse_entry_point(script, args, monkeypatch)
        case ["torchrun", *launcher]:
            script = next(word for word in launcher if word.endswith(".py"))
            parse_entry_point(script, launcher[launcher.index(script) + 1 :], monkeypatch)
        case ["sbatch", script, *extra]:
            srun = slurm_command(REPO / script, extra)
            assert srun[0] == "python"
            parse_entry_point(srun[1], srun[2:], monkeypatch)
        case ["curl", *args]:
            check_request(args)
        case ["hf", "download", *_]:
            assert [e for e in entry_points(group="console_scripts") if e.name == "hf"], "no hf command"
        case _:
            check_setup(command)


def stand_in_run(run: Path) -> None:
    """A run folder whose last checkpoint describes a small.yaml model (char ids) and holds no weights."""
    checkpoints = run / "checkpoints"
    checkpoints.mkdir(parents=True)
    spec = CharTokenizer.from_texts(["abc"]).spec()
    description = describe(GPTConfig(vocab_size=4, context_length=128, n_layer=4, n_head=4, n_embd=256), spec)
    torch.save({MODEL_KEY: description, "state_dict": {}}, checkpoints / "last.ckpt")


def test_the_guides_commands_are_found() -> None:
    """The README's quick start and test command, a guide's command and an inline one are among them."""
    assert ("python", "-m", "pytest") in COMMANDS
    assert ("python", "train.py", "--config", "small.yaml") in COMMANDS
    assert COMMANDS[("pip", "install", "torch==2.13.0")] == "README.md"
    assert any(source == "docs/distributed.md" and c[0] == "torchrun" for c, source in COMMANDS.items())
    assert ("python", "generate.py", "--help") in COMMANDS


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    path = tmp_path / "play.txt"
    path.write_text(make_play(300))
    return path


def guide_yaml_with(text: str) -> dict:
    """The guides' YAML example that contains `text`."""
    (block,) = [block for block in re.findall(r"```yaml\n(.*?)```", TEXT, re.S) if text in block]
    return yaml.safe_load(block)


def yaml_example(tmp_path: Path) -> list[str]:
    """The training guide's two YAML examples over tiny.yaml: callbacks by name, and a second CSV
    log, in tmp_path instead of /shared/logs."""
    by_name = guide_yaml_with("EarlyStopping")
    lists = guide_yaml_with("/shared/logs")
    (shared,) = [entry for entry in lists["trainer"]["logger"] if "init_args" in entry]
    shared["init_args"]["save_dir"] = str(tmp_path / "shared" / "logs")
    paths = []
    for name, example in (("by_name", by_name), ("lists", lists)):
        paths += ["--config", str(tmp_path / f"{name}.yaml")]
        Path(paths[-1]).write_text(yaml.safe_dump(example))
    return paths


def command_line_example() -> list[str]:
    """The training guide's options that append early stopping on the command line."""
    (options,) = re.findall(r"`(--trainer\.callbacks\+=EarlyStopping [^`]*)`", TEXT)
    return options.split()


@pytest.mark.slow  # seconds of training each, and train.py runs ldconfig to find libc
@pytest.mark.parametrize("form", ["yaml", "command line"])
def test_early_stopping_as_the_guide_adds_it_stops_when_val_loss_stops_improving(
    corpus: Path, tmp_path: Path, form: str
) -> None:
    added = yaml_example(tmp_path) if form == "yaml" else command_line_example()
    run = tmp_path / "run"
    assert train_main(tiny_args(corpus, run, *added, *FROZEN, *SMALL)) == 0

    # The first validation set the best loss; three more without improvement (patience 3) stopped
    # the run at step 4 of tiny.yaml's 40.
    val_losses = [float(row["val_loss"]) for row in read_metrics(run) if row.get("val_loss")]
    assert len(val_losses) == 4 and len(set(val_losses)) == 1, val_losses
    (config,) = run.glob("csv/version_*/config.yaml")
    assert yaml.safe_load(config.read_text())["trainer"]["max_steps"] == 40
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 4
    stopper = checkpoint["callbacks"][EarlyStopping(monitor="val_loss").state_key]
    assert (stopper["patience"], stopper["wait_count"]) == (3, 3)
    assert stopper["stopping_reason"] == EarlyStoppingReason.PATIENCE_EXHAUSTED.value
    if form == "yaml":  # the example's second CSV log has the same curve
        (shared,) = (tmp_path / "shared" / "logs" / "small").glob("version_*/metrics.csv")
        with shared.open() as f:
            assert [float(row["val_loss"]) for row in csv.DictReader(f) if row["val_loss"]] == val_losses


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize(
    "page",
    [*GUIDES, *sorted((REPO / "docs" / "results").glob("*.md")), *sorted((REPO / "benchmarks").glob("*.md"))],
    ids=lambda page: page.relative_to(REPO).as_posix(),
)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name} links to {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", linked.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, f"{page.name} links to {target}: no such heading"
