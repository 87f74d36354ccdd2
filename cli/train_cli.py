"""`MiniGPTCLI`: train.py's LightningCLI: the settings it fills in from the weights and the run
folder, `--print_config` after them, and the checks of the objects it builds. Its parser is in
`train_parser.py`, what every run does by default in `train_defaults.py`."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from minigpt.checkpoints.pretrained import open_pretrained, pretrained_config
from minigpt.common import UsageError
from minigpt.data.chat.datamodule import ChatDataModule
from minigpt.data.config import micro_batch
from minigpt.model import GPTConfig
from minigpt.training.allocator import keep_freed_memory
from minigpt.training.global_batch import apply_tokens_per_step, planned_accumulation
from minigpt.training.precision import resolve_precision
from minigpt.training.profiler import QuietProfiler

from .command import USER_ERRORS
from .train_defaults import (
    CALLBACK_ORDER,
    Callbacks,
    Loggers,
    by_name,
    check_names,
    entries_of,
    parser_defaults,
    place_in_run_folder,
    use_new_names,
)
from .train_parser import (
    TrainParser,
    class_at,
    class_path,
    data_nulls_as_dicts,
    help_topic,
    model_class_named,
    ours_first,
)

DEFAULT_RUN_DIR = "runs/default"
_UNSET_CONTEXT = 987_654_321


class MiniGPTCLI(LightningCLI):
    """LightningCLI with resuming, the allocator setting, and run-folder defaults for paths.

    `data` is any LightningDataModule, `datamodule_class` by default: a config that names none
    (`data: {config: ...}`) gets it, and one may pick another with `data.class_path` (configs/sft.yaml
    picks minigpt.data.ChatDataModule), its settings under `data.init_args` or straight under `data`.
    `model` likewise is `model_class` or a subclass of it that `model.class_path` names
    (configs/dpo.yaml: minigpt.training.dpo.LitDPO), its settings always straight under `model`.
    """

    def __init__(
        self,
        model_class: type[L.LightningModule],
        datamodule_class: type[L.LightningDataModule],
        **kwargs: Any,
    ) -> None:
        self.default_data_class = datamodule_class
        model_class = model_class_named(list(kwargs.get("args") or []), model_class)
        super().__init__(model_class, L.LightningDataModule, subclass_mode_data=True, **kwargs)

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
            "follows from it, the micro-batch (batch_size x context; two windows a pair for preference "
            "pairs) and the number of "
            "processes, so the optimisation is the same on any number of devices. null: as the trainer says.",
        )
        parser.add_argument(
            "--model.class_path",
            type=str,
            default=class_path(self.model_class),
            help="The LightningModule that trains: minigpt.training.lit.LitGPT or a subclass of it.",
        )
        data_class = self.default_data_class
        if isinstance(parser, TrainParser):
            parser.default_data_class = data_class
        parser.set_defaults({"data": {"class_path": class_path(data_class)}})
        parser.link_arguments("model.gpt.context_length", "data.init_args.context_length")
        # Defaults of the parser, not fallbacks in code, so --print_config shows them all.
        parser.set_defaults({"trainer.default_root_dir": DEFAULT_RUN_DIR, **parser_defaults()})
        for key, kind in (("callbacks", Callbacks), ("loggers", Loggers)):
            parser.add_argument(
                f"--{key}",
                type=kind,
                default=kind(),
                help=f"The run's {key} by class name: settings set one (and add it if the run lacks "
                "it), false removes it (docs/training.md).",
            )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # A fine-tune takes its shape from the weights, and jsonargparse's --print_config prints
        # before that, in the parser's order (Lightning's first): it is answered here, after.
        print_config = "--print_config" in args
        args, topic = help_topic([arg for arg in args if arg != "--print_config"])
        if isinstance(parser, TrainParser):
            parser.help_topic = topic
        self._args = data_nulls_as_dicts(args)
        check_names(self._args)
        super().parse_arguments(parser, self._args)
        if by_names := self.named_changes():
            self.config = parser.parse_args([*self._args, *by_names])
        use_new_names(self.config)
        self.weights_tokenizer: dict[str, Any] | None = None
        """The tokenizer spec of the weights `model.init_from` names."""
        if self.config.model.get("init_from"):
            self.weights_tokenizer = use_pretrained_shape(self.config, self.given_gpt_settings())
        if print_config:
            print(parser.dump(ours_first(self.config), skip_none=False), end="")
            if self.config.get("tokens_per_step") is not None:
                print("# " + self.planned_accumulation())
            sys.exit(0)

    def named_changes(self) -> list[str]:
        """`callbacks:` and `loggers:` applied to the trainer's lists, as options that set them."""
        trainer, out = self.config.trainer, []
        for key, changes, order in (
            ("callbacks", self.config.get("callbacks"), CALLBACK_ORDER),
            ("logger", self.config.get("loggers"), []),
        ):
            changes = {name: value for name, value in vars(changes or {}).items() if value is not None}
            if changes:
                entries = [entry.as_dict() for entry in entries_of(trainer.get(key))]
                out.append(f"--trainer.{key}=" + json.dumps(by_name(entries, changes, order)))
        return out

    def planned_accumulation(self) -> str:
        config = self.config
        data = config.data.init_args
        # ChatDataModule's, PreferenceDataModule's, QuestionsDataModule's or TextDataModule's
        settings = data.get("conversations") or data.get("pairs") or data.get("questions") or data.config
        rows = class_at(config.data.class_path).batch_rows  # a class the parser resolved
        return planned_accumulation(
            config.tokens_per_step,
            micro_batch(settings.batch_size, data.context_length, rows),
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
        # Named where model_class_named cannot see it (a YAML string given to --config or --model).
        if config.model.get("class_path") != class_path(self.model_class):
            raise UsageError("name model.class_path in a config file or with --model.class_path CLASS")
        del config.model["class_path"]  # not a setting of the class: instantiate_classes puts it back
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
                c for c in entries_of(trainer.get("callbacks")) if "ProgressBar" not in c.class_path
            ]

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        try:
            trainer = super().instantiate_trainer(**kwargs)
            # Lightning checks the devices against SLURM's or torchrun's processes only when it
            # launches them; here, so that a mismatch is refused before anything starts.
            environment = getattr(trainer.strategy, "cluster_environment", None)
            if environment is not None:
                environment.validate_settings(num_devices=trainer.num_devices, num_nodes=trainer.num_nodes)
            if type(trainer.profiler) is PassThroughProfiler:  # no profiler asked for
                trainer.profiler = QuietProfiler()
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
        finally:  # the saved config names the class, as --print_config does
            self.config.model["class_path"] = class_path(self.model_class)
        if isinstance(self.trainer.strategy, FSDPStrategy | ModelParallelStrategy):
            if self.model.optim_config.optimizer == "muon":
                raise UsageError(
                    "model.optim.optimizer muon orthogonalises whole weight matrices, which FSDP shards "
                    "over the processes: use adamw with FSDP, or DDP with muon"
                )
            if self.model.lora is not None:
                raise UsageError(
                    "model.lora trains on one device or with DDP: FSDP's sharded checkpoints are "
                    "neither merged nor written as adapters"
                )
        # Chat and preference data are read with the tokenizer of the weights they tune.
        if (use_tokenizer := getattr(self.datamodule, "use_tokenizer", None)) is not None:
            if self.weights_tokenizer is None:
                what = "chat" if isinstance(self.datamodule, ChatDataModule) else "this"
                raise UsageError(
                    f"{what} data fine-tunes trained weights, whose tokenizer reads it: set "
                    "--model.init_from (a run folder, a checkpoint or GPT-2's weights)"
                )
            use_tokenizer(self.weights_tokenizer)
        if (tokens := self.config.get("tokens_per_step")) is not None:
            apply_tokens_per_step(self.trainer, tokens, self.datamodule.micro_batch())


def user_error_in(err: BaseException) -> BaseException | None:
    """The first error a user can cause in `err`'s chain of causes, if there is one."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, USER_ERRORS):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def use_pretrained_shape(config: Namespace, given: set[str]) -> dict[str, Any]:
    """Fill `model.gpt` from the weights `model.init_from` names, keeping what the run may change
    (dropout, attention, a shorter context); refuse settings and tokenizers the weights exclude.
    Returns the weights' tokenizer spec."""
    source = config.model.init_from
    _, weights, spec = open_pretrained(source)
    data = config.data.init_args
    # Text data names its tokenizer; chat data reads the weights' (ChatDataModule.use_tokenizer).
    tokenizer = data.config.tokenizer if data.get("config") else spec["name"]
    if tokenizer != spec["name"]:
        raise UsageError(
            f"data.config.tokenizer is {tokenizer!r}, but the weights of {source} read {spec['name']!r} "
            f"token ids; set --data.config.tokenizer {spec['name']}"
        )
    ours = GPTConfig(**config.model.gpt.as_dict())
    merged = pretrained_config(weights, ours, given, source)
    for name, value in asdict(merged).items():
        config.model.gpt[name] = value
    data.context_length = merged.context_length
    return spec
