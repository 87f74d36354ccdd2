"""A checkpoint that FSDP training wrote as a folder of shards (`state_dict_type: sharded`).

Lightning's layout: `meta.pt` holds everything but the tensors (our description among it), and the
weights and optimizer states are a `torch.distributed.checkpoint` folder (`.metadata` and one
`__<rank>_0.distcp` file per process) under the keys `model` and `optimizer_<i>`. The weights load
into one process, on any number of devices, without a process group.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from .description import MODEL_KEY
from .errors import CheckpointError
from .model_file import ModelFile
from .pickled import load_tensors_only

META_FILE = "meta.pt"
SHARDS_INDEX = ".metadata"


def is_sharded_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / META_FILE).is_file() and (path / SHARDS_INDEX).is_file()


class ShardedCheckpoint:
    """A folder of FSDP shards; its weights are gathered from every shard file."""

    name = "sharded"

    def recognizes(self, path: Path) -> bool:
        return is_sharded_checkpoint(path)

    def open(self, path: Path) -> ModelFile:
        meta = load_tensors_only(path / META_FILE, f"cannot read {path / META_FILE}: truncated or foreign")
        if not isinstance(meta, dict) or MODEL_KEY not in meta:
            raise CheckpointError(f"{path} is not a minigpt checkpoint")
        return ModelFile(path, meta[MODEL_KEY], lambda model: _load_shards(model, path))


def _load_shards(model: nn.Module, path: Path) -> None:
    import torch.distributed.checkpoint as dcp  # ~1 s to import: only where shards are read

    # The LightningModule held the network as `model`: its keys are the network's with that prefix.
    state = {"model": {f"model.{key}": value for key, value in model.state_dict().items()}}
    try:
        with warnings.catch_warnings():  # that it reads in one process, as asked
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=str(path), no_dist=True)  # into the tensors, in place
    except (RuntimeError, ValueError, OSError) as err:
        detail = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise CheckpointError(f"cannot read the shards of {path}: {detail}") from None
    with torch.no_grad():
        model.load_state_dict({key.removeprefix("model."): value for key, value in state["model"].items()})
