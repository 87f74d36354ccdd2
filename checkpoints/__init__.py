"""The one home of every on-disk model format: load a trained model, write it for others.

A model file is read into a *description* (the model's shape and its tokenizer, see
`description.py`) and a state dict for `minigpt.model.GPT`; `load_model` builds both. Each format
lives in `formats.py` behind the same small interface, and the pure state-dict conversions
between layouts live in `convert.py`, which needs nothing but torch. Besides our own files it
reads Hugging Face folders (`huggingface.py`: GPT-2's layout, or ours with custom code) and
writes them (`hf_export.py`). Nothing here imports Lightning, transformers or the training
module, so generation, export and inference tools load models the same way without them.
"""

from .description import MODEL_KEY, describe, read_description
from .errors import CheckpointError
from .formats import FORMATS, ModelFile, check_readable, open_model_file, resolve_checkpoint
from .hf_export import save_huggingface
from .load import load_model, save_safetensors

__all__ = [
    "FORMATS",
    "MODEL_KEY",
    "CheckpointError",
    "ModelFile",
    "check_readable",
    "describe",
    "load_model",
    "open_model_file",
    "read_description",
    "resolve_checkpoint",
    "save_huggingface",
    "save_safetensors",
]
