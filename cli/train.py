"""`train.py`: LightningCLI over `LitGPT` and `TextDataModule`, loggers and callbacks from the YAML."""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import Namespace, set_parsing_settings
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from minigpt.checkpoints import CheckpointError, check_readable
from minigpt.checkpoints.pretrained import open_pretrained, pretrained_config
from minigpt.checkpoints.sharded import is_sharded_checkpoint
from minigpt.common import UsageError
from minigpt.data import TextDataModule
from minigpt.model import GPTConfig
from minigpt.training.allocator import keep_freed_memory
from minigpt.training.callbacks import DivergenceError, SaveAndStopOnSignal
from minigpt.training.global_batch import apply_tokens_per_step, planned_accumulation
from minigpt.training.lightning_internals import help_showing
from minigpt.training.lit import LitGPT
from minigpt.training.precision import resolve_precision

from .common import USER_ERRORS, report, resolve_config_args

DEFAULT_RUN_DIR = "runs/default"
_UNSET_CONTEXT = 987_654_321

LIGHTNING_HELP = "trainer"
"""The topic of `--help trainer`: Lightning's own settings, which plain `--help` leaves out."""
LIGHTNING_KEYS = ("trainer", "optimizer", "lr_scheduler")
"""Lightning's settings: ~700 lines of `--help` and most of `--print_config`, so they come last."""


class TrainParser(LightningArgumentParser):
    """LightningCLI's parser, whose `--help` shows our settings (the model, its optimisation, the
    data, the run) and leaves Lightning's to `--help trainer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prog", "train.py")
        kwargs.setdefault("usage", "%(prog)s --config FILE [--config FILE ...] [--section.key VALUE ...]")
        kwargs.setdefault(
            "description",
            "Train a GPT. Settings come from --config files (a name in configs/, or a path), laid over "
            "each other in order, then from --section.key overrides; --print_config shows them all. "
            "Lightning's Trainer settings (--trainer.max_steps, --trainer.precision, loggers, "
            f"callbacks, ...) are left out here: see them with `%(prog)s --help {LIGHTNING_HELP}`.",
        )
        super().__init__(*args, **kwargs)
        self.help_topic: str | None = None

    def format_help(self, *args: Any, **kwargs: Any) -> str:
        lightning = self.help_topic == LIGHTNING_HELP
        description = self.description
        if lightning:
            self.description = (
                "Lightning's settings for train.py: the Trainer's (--trainer.*) and LightningCLI's "
                "--optimizer and --lr_scheduler. `%(prog)s --help` shows the model's, the data's "
                "and the run's."
            )
        try:
            # Neither argparse nor jsonargparse can leave a group out of the help: see help_showing.
            with help_showing(self, lambda action: is_lightnings(action.dest) == lightning):
                return super().format_help(*args, **kwargs)
        finally:
            self.description = description


def is_lightnings(key: str) -> bool:
    """Whether a setting (`trainer.max_steps`, `optimizer`, ...) is Lightning's rather than ours."""
    return key.split(".", 1)[0] in LIGHTNING_KEYS


def help_topic(args: list[str]) -> tuple[list[str], str | None]:
    """`--help trainer` (or `--help=trainer`) as `--help` and its topic; other arguments as they are."""
    # jsonargparse's --help takes no topic.
    for i, arg in enumerate(args):
        if arg in ("-h", "--help") and args[i + 1 : i + 2] == [LIGHTNING_HELP]:
            return args[: i + 1] + args[i + 2 :], LIGHTNING_HELP
        if arg == f"--help={LIGHTNING_HELP}":
            return [*args[:i], "--help", *args[i + 1 :]], LIGHTNING_HELP
    return args, None


def ours_first(config: Namespace) -> Namespace:
    """`config` with the model, the data and the run's settings before Lightning's, as
    `--print_config` shows them (the trainer's loggers and callbacks alone run to ~140 lines)."""
    items = vars(config)
    order = sorted(items, key=lambda key: (is_lightnings(key), key not in ("model", "data")))
    return Namespace(**{key: items[key] for key in order})


class MiniGPTCLI(LightningCLI):
    """LightningCLI with resuming, the allocator setting, and run-folder defaults for paths."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
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
        parser.add_argument(
            "--tokens_per_step",
            type=int | None,
            default=None,
            help="The global batch: tokens per optimizer step over every process. accumulate_grad_batches "
            "follows from it, the micro-batch (data.config.batch_size x context) and the number of "
            "processes, so the optimisation is the same on any number of devices. null: as the trainer says.",
        )
        parser.link_arguments("model.gpt.context_length", "data.context_length")
        # A default of the parser, not a fallback in code, so --print_config shows the run folder.
        parser.set_defaults({"trainer.default_root_dir": DEFAULT_RUN_DIR})

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # A fine-tune takes its shape from the weights, and jsonargparse's --print_config prints
        # before that, in the parser's order (Lightning's first): it is answered here, after.
        print_config = "--print_config" in args
        args, topic = help_topic([arg for arg in args if arg != "--print_config"])
        if isinstance(parser, TrainParser):
            parser.help_topic = topic
        self._args = args
        super().parse_arguments(parser, self._args)
        if self.config.model.get("init_from"):
            use_pretrained_shape(self.config, self.given_gpt_settings())
        if print_config:
            print(parser.dump(ours_first(self.config), skip_none=False), end="")
            if self.config.get("tokens_per_step") is not None:
                print("# " + self.planned_accumulation())
            sys.exit(0)

    def planned_accumulation(self) -> str:
        config = self.config
        return planned_accumulation(
            config.tokens_per_step,
            config.data.config.batch_size,
            config.data.context_length,
            config.trainer.get("devices"),
            config.trainer.get("num_nodes") or 1,
        )

    def given_gpt_settings(self) -> set[str]:
        """The `model.gpt` settings the config files and command line set (not defaults).

        Parsed again without defaults. The link to data.context_length needs its source, so a
        placeholder goes first, where any config file or later option overrides it.
        """
        # jsonargparse keeps no record of where a value came from: parsing without defaults is its
        # only way to tell a given setting from a default.
        unset = str(_UNSET_CONTEXT)
        args = [f"--model.gpt.context_length={unset}", *self._args]
        given = self.parser.parse_args(args, defaults=False).get("model.gpt")
        names = set(given.keys()) if isinstance(given, Namespace) else set()
        if given is not None and given.get("context_length") == _UNSET_CONTEXT:
            names.discard("context_length")
        return names

    def before_instantiate_classes(self) -> None:
        config = self.config
        if config.get("keep_freed_memory"):
            keep_freed_memory()  # before the model and data allocate anything
        trainer = config.trainer
        if trainer.get("gradient_clip_val"):
            raise UsageError(
                "set gradient clipping with --model.optim.grad_clip, not --trainer.gradient_clip_val"
            )
        trainer.precision = resolve_precision(trainer.get("precision"), trainer.get("accelerator"))
        # null is Lightning's "the working directory", as the Trainer will read it.
        place_in_run_folder(trainer, Path(trainer.default_root_dir or os.getcwd()))
        if trainer.get("enable_progress_bar") is False:
            # Lightning's own switch keeps working: it refuses a progress bar among the callbacks.
            trainer.callbacks = [
                c for c in _entries(trainer.get("callbacks")) if "ProgressBar" not in c.class_path
            ]

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        try:
            trainer = super().instantiate_trainer(**kwargs)
            # Lightning checks the devices against SLURM's or torchrun's processes only when it
            # launches them; here, so that a mismatch is refused before anything starts.
            environment = getattr(trainer.strategy, "cluster_environment", None)
            if environment is not None:
                environment.validate_settings(num_devices=trainer.num_devices, num_nodes=trainer.num_nodes)
        except (ValueError, MisconfigurationException) as err:
            # Lightning's checks of the accelerator, strategy, devices and cluster: settings the user
            # chose, such as FSDP without a GPU, or devices that disagree with SLURM's tasks.
            raise UsageError(f"trainer: {err}") from None
        return trainer

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as err:
            # jsonargparse wraps what a class raised while it was built (a callback's ConfigError)
            # in its own error, whose message lists every object of the list it was in.
            cause = user_error_in(err)
            if cause is None:
                raise
            raise cause from None
        if isinstance(self.trainer.strategy, FSDPStrategy | ModelParallelStrategy):
            if self.model.optim_config.optimizer == "muon":
                raise UsageError(
                    "model.optim.optimizer muon orthogonalises whole weight matrices, which FSDP shards "
                    "over the processes: use adamw with FSDP, or DDP with muon"
                )
        if (tokens := self.config.get("tokens_per_step")) is not None:
            data = self.datamodule
            apply_tokens_per_step(self.trainer, tokens, data.config.batch_size, data.context_length)


def user_error_in(err: BaseException) -> BaseException | None:
    """The first error a user can cause in `err`'s chain of causes, if there is one."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, USER_ERRORS):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def use_pretrained_shape(config: Namespace, given: set[str]) -> None:
    """Fill `model.gpt` from the weights `model.init_from` names, keeping what the run may change
    (dropout, attention, a shorter context); refuse settings and tokenizers the weights exclude."""
    source = config.model.init_from
    _, weights, spec = open_pretrained(source)
    tokenizer = config.data.config.tokenizer
    if tokenizer != spec["name"]:
        raise UsageError(
            f"data.config.tokenizer is {tokenizer!r}, but the weights of {source} read {spec['name']!r} "
            f"token ids; set --data.config.tokenizer {spec['name']}"
        )
    ours = GPTConfig(**config.model.gpt.as_dict())
    merged = pretrained_config(weights, ours, given, source)
    for name, value in asdict(merged).items():
        config.model.gpt[name] = value
    config.data.context_length = merged.context_length


def _entries(value: Any) -> list[Namespace]:
    """The class_path entries of a `trainer.logger` or `trainer.callbacks` value (one or a list)."""
    items = value if isinstance(value, list) else [value]
    return [item for item in items if isinstance(item, Namespace) and item.get("class_path")]


def place_in_run_folder(trainer: Namespace, run_dir: Path) -> None:
    """Point the paths the YAML leaves null into the run folder: loggers' `save_dir`, and
    ModelCheckpoint's `dirpath` (`<run>/checkpoints`, where `--ckpt_path last` looks)."""
    for entry in _entries(trainer.get("logger")):
        if "save_dir" in entry.init_args and entry.init_args.save_dir is None:
            entry.init_args.save_dir = str(run_dir)
    for entry in _entries(trainer.get("callbacks")):
        if entry.class_path.endswith(".ModelCheckpoint") and entry.init_args.get("dirpath") is None:
            entry.init_args.dirpath = str(run_dir / "checkpoints")


class SaveAndLogConfig(SaveConfigCallback):
    """Lightning's config.yaml beside the CSV metrics, and the full config in every other logger
    (the wandb run's config, TensorBoard's hparams)."""

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        config = self.config.as_dict()
        for logger in trainer.loggers:
            if not isinstance(logger, CSVLogger):
                logger.log_hyperparams(config)


def check_output_dir(out_dir: Path, ckpt_path: str | None) -> None:
    """Refuse to start a new run on top of another run's checkpoints, or to resume from nothing."""
    checkpoints = out_dir / "checkpoints"
    if ckpt_path is None and checkpoints.is_dir() and any(checkpoints.glob("*.ckpt")):
        raise UsageError(
            f"{out_dir} already holds a run: resume it with --ckpt_path last, "
            "or choose another --trainer.default_root_dir"
        )
    if ckpt_path == "last":
        last = checkpoints / "last.ckpt"
        if not (last.is_file() or is_sharded_checkpoint(last)):
            raise UsageError(f"--ckpt_path last: there is no {last} to resume from")
        if last.is_file():
            check_readable(last)
    elif ckpt_path is not None:
        path = Path(ckpt_path)
        if is_sharded_checkpoint(path):  # FSDP's folder of shards
            return
        if not path.is_file():
            raise CheckpointError(f"checkpoint not found: {ckpt_path}")
        check_readable(path)


def train_main(args: Sequence[str] | None = None) -> int:
    """Parse the command line, then fit. Returns the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda"):
        logging.getLogger(name).addFilter(_SaidElsewhere())
    # Two warnings every run would print from inside Lightning, about nothing the user can change:
    # its model summary cannot size bf16 weights, and its pytree helper uses an API torch deprecated.
    warnings.filterwarnings("ignore", message="Precision bf16-mixed is not supported by the model summary")
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # Logs are written every log_every_n_steps steps counted over the whole run, not per epoch:
    # an epoch shorter than that (tiny data) loses none, whatever this warning says.
    warnings.filterwarnings(
        "ignore", message=r"The number of training batches \(\d+\) is smaller than the logging interval"
    )
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
                parser_class=TrainParser,
                parser_kwargs={"exit_on_error": False},
                save_config_callback=SaveAndLogConfig,
                save_config_kwargs={"overwrite": True},
            )
        check_output_dir(Path(cli.trainer.default_root_dir), cli.config.ckpt_path)
        if cli.config.ckpt_path is not None:
            cli.model.init_from = None  # a resumed run takes its weights from the checkpoint
        try:
            cli.trainer.fit(
                cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.ckpt_path, weights_only=True
            )
        except SystemExit:
            if (code := _stopped_at_once(cli.trainer)) is None:
                raise
            return code
    except USER_ERRORS as err:
        return report(err)
    except DivergenceError as err:
        if cli.trainer.is_global_zero:  # every rank raises it; one reports it
            last = Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
            kept = f"the last good checkpoint is {last}" if last.is_file() else "no checkpoint was written"
            print(f"error: training diverged: {err}; {kept}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted before training started", file=sys.stderr)
        return 130
    stopper = next((c for c in cli.trainer.callbacks if isinstance(c, SaveAndStopOnSignal)), None)
    if stopper is not None and stopper.received is not None:
        if cli.trainer.is_global_zero:
            print(
                f"stopped by {signal.Signals(stopper.received).name}: saved step {stopper.saved_step} to "
                f"{stopper.path}; continue with the same command and --ckpt_path last",
                file=sys.stderr,
            )
        return 128 + stopper.received
    return 0


def _stopped_at_once(trainer: L.Trainer) -> int | None:
    """The exit code of a run that a second signal stopped in mid-step; None for any other exit.

    SaveAndStopOnSignal turns a second SIGINT or SIGTERM into KeyboardInterrupt, which Lightning
    answers by shutting down and calling sys.exit(1), as if the run had failed.
    """
    stopper = next((c for c in trainer.callbacks if isinstance(c, SaveAndStopOnSignal)), None)
    if stopper is None or stopper.received is None or not trainer.interrupted:
        return None
    if trainer.is_global_zero:
        name = signal.Signals(stopper.received).name
        print(f"stopped at once by a second {name}: the step in progress was not saved", file=sys.stderr)
    return 128 + stopper.received


class _SaidElsewhere(logging.Filter):
    """Drops Lightning's lines about the devices and the precision, which the run's summary
    states (RunSummary), and its suggestion to install its hosted logger, at every start."""

    UNSAID = re.compile(
        r"(GPU|TPU|HPU) available: |Using (16bit|bfloat16) Automatic Mixed Precision \(AMP\)$"
        r"|LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES: |.*litlogger"
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return self.UNSAID.match(record.getMessage()) is None
