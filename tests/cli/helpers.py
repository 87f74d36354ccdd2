"""What several test modules of this folder, and others, share."""

from __future__ import annotations

from minigpt.cli.command import resolve_config_args
from minigpt.cli.train import MiniGPTCLI
from minigpt.data import TextDataModule
from minigpt.training.lit import LitGPT


def parse(*args: str) -> MiniGPTCLI:
    """Parse (and instantiate) a command line without training."""
    from lightning.pytorch.cli import LightningCLI

    class ParseOnly(MiniGPTCLI):
        def instantiate_trainer(self, **kwargs):  # no loggers, no output folder
            return LightningCLI.instantiate_trainer(self, logger=False, **kwargs)

    return ParseOnly(
        LitGPT,
        TextDataModule,
        run=False,
        args=resolve_config_args(list(args)),
        parser_kwargs={"exit_on_error": False},
    )
