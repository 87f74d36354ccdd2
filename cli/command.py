"""What every command line shares: finding config files, typed option parsing, one-line errors."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import docstring_parser
import yaml
from jsonargparse import (
    ActionConfigFile,
    ActionYesNo,
    ArgumentError,
    ArgumentParser,
    Namespace,
    set_parsing_settings,
)

from minigpt.checkpoints import CheckpointError
from minigpt.common import UsageError, one_line
from minigpt.data import DataError
from minigpt.model import ConfigError

CONFIG_DIRS = (Path.cwd() / "configs", Path(__file__).resolve().parents[1] / "configs")
"""Where a bare config name such as `small.yaml` is looked up, in order."""

USER_ERRORS = (UsageError, ConfigError, DataError, CheckpointError, ArgumentError)
"""Errors a user can cause (a bad option, file or checkpoint): one line and exit 2, no traceback."""

T = TypeVar("T")


def resolve_config_args(argv: Sequence[str]) -> list[str]:
    """Let `--config small.yaml` (or `--config small`) name a file in `configs/`."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            out[i + 1] = find_config(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + find_config(arg.split("=", 1)[1])
    return out


def find_config(name: str) -> str:
    """The config file `name` names: a path, or a file in `configs/`; checked to be valid YAML."""
    names = [name] if name.endswith((".yaml", ".yml")) else [name, name + ".yaml"]
    candidates = [Path(name)] + [folder / n for folder in CONFIG_DIRS for n in names]
    for path in candidates:
        if path.is_file():
            _check_yaml(path)
            return str(path)
    raise UsageError(f"config file not found: {name} (looked in the working directory and configs/)")


def _check_yaml(path: Path) -> None:
    """Report a YAML syntax error with the file, line and column, before the parser sees it."""
    try:
        yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UsageError(f"{path} is not valid YAML{where}: {err.problem}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise UsageError(f"{path} is not valid YAML: {err}") from None


def report(err: BaseException) -> int:
    """Print a user-caused error as one line; the exit code for it."""
    print(f"error: {one_line(err)}", file=sys.stderr)
    return 2


def options_parser(
    prog: str, description: str, *option_classes: type, skip: frozenset[str] = frozenset(), **defaults: Any
) -> ArgumentParser:
    """A parser whose options are the fields of `option_classes` (dataclasses), at the top level.

    Each option's help is its field's docstring. A bool field becomes a flag pair (`--force` /
    `--no_force`), as people expect of a command line. Fields named in `skip` are no options of
    this command (`build` gives them their defaults). `defaults` override the classes' own
    defaults for this command. `--config file.yaml` reads any of the options from a file.
    """
    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # field docstrings become --help
    parser = ArgumentParser(prog=prog, description=description, exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile, help="Read options from this YAML file.")
    for cls in option_classes:
        flags = {f.name for f in dataclasses.fields(cls) if f.type in (bool, "bool")} - skip
        parser.add_class_arguments(cls, nested_key=None, as_group=False, skip=flags | skip)
        docs = {p.arg_name: p.description for p in docstring_parser.parse_from_object(cls).params}
        for field in dataclasses.fields(cls):
            if field.name in flags:
                help_text = " ".join((docs.get(field.name) or "").split())
                parser.add_argument(
                    f"--{field.name}", action=ActionYesNo, default=field.default, help=help_text
                )
    parser.set_defaults(**defaults)
    return parser


def parse_options(parser: ArgumentParser, argv: Sequence[str] | None, *option_classes: type) -> list[Any]:
    """Parse `argv` (default: sys.argv) and build one instance of each class from its fields, so
    each class's own checks (`__post_init__`) validate the values."""
    args = list(sys.argv[1:] if argv is None else argv)
    namespace: Namespace = parser.parse_args(resolve_config_args(args))
    return [build(cls, namespace) for cls in option_classes]


def build(cls: Callable[..., T], namespace: Namespace) -> T:
    """An instance of the dataclass `cls` from the same-named values of `namespace`; a field the
    namespace lacks (skipped by `options_parser`) keeps its default."""
    fields = [f.name for f in dataclasses.fields(cls) if f.name in namespace]  # type: ignore[arg-type]
    return cls(**{name: namespace[name] for name in fields})
