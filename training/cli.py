"""Command-line entry points: `train.py` (LightningCLI) and `generate.py`."""

from __future__ import annotations

import argparse
import logging
import netrc
import os
import signal
import socket
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import ArgumentError, set_parsing_settings
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger

from minigpt.data import DataError, TextDataModule
from minigpt.model import ConfigError

from .allocator import keep_freed_memory
from .callbacks import AtomicCheckpointIO, SaveAndStopOnSignal, TokensPerSecond
from .checkpoint import CheckpointError, check_readable
from .config import WandbConfig
from .lit import DivergenceError, LitGPT

log = logging.getLogger("minigpt")

CONFIG_DIRS = (Path.cwd() / "configs", Path(__file__).resolve().parents[1] / "configs")
"""Where a bare config name such as `small.yaml` is looked up, in order."""

USER_ERRORS = (ConfigError, DataError, CheckpointError, ArgumentError)


class UsageError(ValueError):
    """A command line that cannot be run as given."""


def resolve_config_args(argv: list[str]) -> list[str]:
    """Let `--config small.yaml` (or `--config small`) name a file in `configs/`."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            out[i + 1] = _find_config(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + _find_config(arg.split("=", 1)[1])
    return out


def _find_config(name: str) -> str:
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


def wandb_logged_in() -> bool:
    """True when wandb has credentials: WANDB_API_KEY, or a netrc entry for its host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_reachable(timeout: float = 3.0) -> bool:
    """Whether wandb's server answers a TCP connection, so an online run won't hang at start."""
    url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    host = url.split("://")[-1].split("/")[0]
    port = 80 if url.startswith("http://") else 443
    if ":" in host:
        host, port = host.rsplit(":", 1)[0], int(host.rsplit(":", 1)[1])
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def wandb_mode(config: WandbConfig) -> str:
    mode = (os.environ.get("WANDB_MODE") or "auto") if config.mode == "auto" else config.mode
    if mode == "dryrun":
        mode = "offline"
    if mode not in ("auto", "online", "offline", "disabled"):
        raise UsageError(f"WANDB_MODE={mode!r} is not one of online, offline, disabled")
    if mode == "auto":
        mode = "online" if wandb_logged_in() else "offline"
        if mode == "online" and not wandb_reachable():
            log.warning("wandb: logged in but its server is unreachable; logging offline (wandb sync later)")
            mode = "offline"
    if mode == "online" and not wandb_logged_in():
        raise UsageError(
            "wandb mode is online but no credentials were found: run `wandb login` or set WANDB_API_KEY"
        )
    return mode


def _cpu_has_bf16() -> bool:
    """oneDNN's own check (AVX512-BF16 or AMX); assume yes where this PyTorch build cannot tell."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


def resolve_precision(precision: Any) -> Any:
    """Fall back from bf16 to fp32 on CPUs without native bf16 (emulated bf16 is slower than fp32)."""
    if str(precision).startswith("bf16") and not torch.cuda.is_available():
        if not _cpu_has_bf16():
            log.warning("this CPU has no native bf16; training in fp32 instead of %s", precision)
            return "32-true"
    if str(precision).startswith("bf16") and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        log.warning("this GPU has no bf16; training with fp16 mixed precision instead")
        return "16-mixed"
    return precision


class MiniGPTCLI(LightningCLI):
    """LightningCLI with the run's loggers, checkpoints and links between model and data."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_class_arguments(WandbConfig, "wandb")
        parser.add_argument(
            "--ckpt_path",
            type=str | None,
            default=None,
            help="Resume from this checkpoint; 'last' picks the run's latest.",
        )
        parser.add_argument(
            "--keep_freed_memory",
            type=bool,
            default=True,
            help="Let malloc reuse freed memory instead of page-faulting it in every step (glibc; faster).",
        )
        parser.link_arguments("model.gpt.context_length", "data.context_length")

    def before_instantiate_classes(self) -> None:
        if self.config.get("keep_freed_memory"):
            keep_freed_memory()  # before the model and data allocate anything

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        trainer_config = dict(self.config_init["trainer"])
        if trainer_config.get("gradient_clip_val"):
            raise UsageError(
                "set gradient clipping with --model.optim.grad_clip, not --trainer.gradient_clip_val"
            )
        out_dir = Path(trainer_config.get("default_root_dir") or "runs/default")
        trainer_config["default_root_dir"] = str(out_dir)
        trainer_config["precision"] = resolve_precision(trainer_config.get("precision"))
        trainer_config["logger"] = self._loggers(out_dir)
        trainer_config["plugins"] = [*(trainer_config.get("plugins") or []), AtomicCheckpointIO()]
        callbacks = list(trainer_config.get("callbacks") or [])
        callbacks += [
            ModelCheckpoint(
                dirpath=out_dir / "checkpoints",
                filename="best",
                monitor="val_loss",
                mode="min",
                save_top_k=1,
                save_last=True,
                auto_insert_metric_name=False,
                enable_version_counter=False,
            ),
            LearningRateMonitor(logging_interval="step"),
            TokensPerSecond(),
            SaveAndStopOnSignal(out_dir / "checkpoints" / "last.ckpt"),
        ]
        trainer_config["callbacks"] = callbacks
        return self._instantiate_trainer(trainer_config, [])

    def _loggers(self, out_dir: Path) -> list[Logger]:
        loggers: list[Logger] = [CSVLogger(save_dir=out_dir, name="csv")]
        wandb_config: WandbConfig = self.config_init["wandb"]
        mode = wandb_mode(wandb_config)
        if mode != "disabled":
            (out_dir / "wandb").mkdir(parents=True, exist_ok=True)
            loggers.append(
                WandbLogger(
                    project=wandb_config.project,
                    name=wandb_config.name,
                    entity=wandb_config.entity,
                    save_dir=str(out_dir),
                    mode=mode,
                    config=self.config.as_dict(),
                )
            )
        return loggers


def check_output_dir(out_dir: Path, ckpt_path: str | None) -> None:
    """Refuse to start a new run on top of another run's checkpoints, or to resume from nothing."""
    checkpoints = out_dir / "checkpoints"
    if ckpt_path is None and checkpoints.is_dir() and any(checkpoints.glob("*.ckpt")):
        raise UsageError(
            f"{out_dir} already holds a run: resume it with --ckpt_path last, "
            "or choose another --trainer.default_root_dir"
        )
    if ckpt_path == "last":
        if not (checkpoints / "last.ckpt").is_file():
            raise UsageError(f"--ckpt_path last: there is no {checkpoints / 'last.ckpt'} to resume from")
        check_readable(checkpoints / "last.ckpt")
    elif ckpt_path is not None:
        path = Path(ckpt_path)
        if not path.is_file():
            raise CheckpointError(f"checkpoint not found: {ckpt_path}")
        check_readable(path)


def train_main(args: list[str] | None = None) -> int:
    """Parse the command line, then fit. Returns the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_NoAdvertising())
    # Two warnings every run would print from inside Lightning, about nothing the user can change:
    # its model summary cannot size bf16 weights, and its pytree helper uses an API torch deprecated.
    warnings.filterwarnings("ignore", message="Precision bf16-mixed is not supported by the model summary")
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # The config dataclasses document each field in a docstring under it; show those in --help.
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    argv = list(sys.argv[1:] if args is None else args)
    try:
        with warnings.catch_warnings():
            # We hand LightningCLI the command line ourselves, after resolving config names.
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
            cli = MiniGPTCLI(
                LitGPT,
                TextDataModule,
                run=False,
                args=resolve_config_args(argv),
                seed_everything_default=1337,
                parser_kwargs={"exit_on_error": False},
                save_config_kwargs={"overwrite": True},
            )
        out_dir = Path(cli.trainer.default_root_dir)
        check_output_dir(out_dir, cli.config.ckpt_path)
        cli.trainer.fit(
            cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.ckpt_path, weights_only=True
        )
    except (*USER_ERRORS, UsageError) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except DivergenceError as err:
        last = out_dir / "checkpoints" / "last.ckpt"
        kept = f"the last good checkpoint is {last}" if last.is_file() else "no checkpoint was written"
        print(f"error: training diverged: {err}; {kept}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted before training started", file=sys.stderr)
        return 130
    stopper = next(c for c in cli.trainer.callbacks if isinstance(c, SaveAndStopOnSignal))
    if stopper.received is not None:
        if cli.trainer.is_global_zero:
            print(
                f"stopped by {signal.Signals(stopper.received).name}: saved step {stopper.saved_step} to "
                f"{stopper.path}; continue with the same command and --ckpt_path last",
                file=sys.stderr,
            )
        return 128 + stopper.received
    return 0


def _one_line(err: BaseException) -> str:
    """The error's message folded onto one line (jsonargparse spreads its messages over several)."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return text or type(err).__name__


class _NoAdvertising(logging.Filter):
    """Drops Lightning's suggestion to install its hosted logger, printed at every start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line instead of usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def generate_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="generate.py",
        description="Sample text from a trained minigpt checkpoint; tokens stream to stdout.",
    )
    parser.add_argument("--checkpoint", required=True, help="a .ckpt/.safetensors file, or a run directory")
    parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    parser.add_argument(
        "--max_new_tokens", type=_non_negative_int, default=200, help="tokens to generate per sample"
    )
    parser.add_argument("--temperature", type=_non_negative_float, default=0.8, help="0 is greedy")
    parser.add_argument(
        "--top_k", type=_positive_int, default=None, help="sample among the k most likely tokens"
    )
    parser.add_argument("--top_p", type=_probability, default=None, help="nucleus sampling mass, in (0, 1]")
    parser.add_argument("--seed", type=int, default=1337, help="random seed, for reproducible samples")
    parser.add_argument("--num_samples", type=_positive_int, default=1, help="independent samples to draw")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (auto: cuda if available)")
    parser.add_argument("--no_cache", action="store_true", help="recompute the whole window each step")
    parser.add_argument(
        "--tokenizer_path", default=None, help="GPT-2 ranks file, on machines that cannot fetch it"
    )
    return parser


def generate_main(args: list[str] | None = None) -> int:
    """Parse the command line, load the checkpoint, stream samples. Returns the exit code."""
    from minigpt.model import generate_tokens, optimize_for_decoding

    from .checkpoint import load_model

    try:
        opts = generate_parser().parse_args(sys.argv[1:] if args is None else args)
        if opts.prompt == "":
            raise UsageError("the prompt is empty: pass some text with --prompt (default is a newline)")
        device = ("cuda" if torch.cuda.is_available() else "cpu") if opts.device == "auto" else opts.device
        model, tokenizer = load_model(opts.checkpoint, device=device, tokenizer_path=opts.tokenizer_path)
        if device == "cpu":
            optimize_for_decoding(model)
        ids = tokenizer.encode(opts.prompt)
        context = model.config.context_length
        if len(ids) > context:
            print(
                f"warning: the prompt has {len(ids)} tokens; only its last {context} fit the context",
                file=sys.stderr,
            )
            ids = ids[-context:]
    except (*USER_ERRORS, UsageError) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2

    generator = torch.Generator(device=device).manual_seed(opts.seed)
    prompt = torch.tensor([ids], device=device)
    for n in range(opts.num_samples):
        if opts.num_samples > 1:
            sys.stdout.write(f"{'' if n == 0 else chr(10)}--- sample {n + 1} ---\n")
        sys.stdout.write(opts.prompt)
        stream = TextStream(tokenizer.decode)
        for token in generate_tokens(
            model,
            prompt,
            opts.max_new_tokens,
            temperature=opts.temperature,
            top_k=opts.top_k,
            top_p=opts.top_p,
            stop_token=tokenizer.eot_id,
            use_cache=not opts.no_cache,
            generator=generator,
        ):
            if token.item() == tokenizer.eot_id:
                break
            sys.stdout.write(stream.push(token.item()))
            sys.stdout.flush()
        sys.stdout.write(stream.flush() + "\n")
        sys.stdout.flush()
    return 0


class TextStream:
    """Turns a stream of token ids into text pieces, holding back partial UTF-8 characters.

    A BPE token can end in the middle of a multi-byte character; decoding it alone would print
    a replacement character, so text is released only once it decodes cleanly.
    """

    def __init__(self, decode: Any) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._emitted = 0

    def push(self, token: int) -> str:
        self._ids.append(token)
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        piece, self._emitted = text[self._emitted :], len(text)
        return piece

    def flush(self) -> str:
        text = self._decode(self._ids)
        return text[self._emitted :]


def export_main(args: list[str] | None = None) -> int:
    """Write a checkpoint's weights as safetensors, with the model description and tokenizer."""
    from .checkpoint import export_safetensors, load_model

    parser = _OneLineParser(prog="export.py", description="Export a checkpoint's weights to safetensors.")
    parser.add_argument("--checkpoint", required=True, help="a .ckpt file, or a run directory")
    parser.add_argument("--out", required=True, help="the .safetensors file to write")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    try:
        opts = parser.parse_args(sys.argv[1:] if args is None else args)
        out = Path(opts.out)
        if out.suffix != ".safetensors":
            raise UsageError(f"--out must end in .safetensors, got {out}")
        if out.exists() and not opts.force:
            raise UsageError(f"{out} already exists; pass --force to replace it")
        model, tokenizer = load_model(opts.checkpoint)
        export_safetensors(model, tokenizer, out)
    except (*USER_ERRORS, UsageError) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({model.num_parameters(non_embedding=False):,} parameters)")
    return 0
