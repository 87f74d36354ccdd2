"""`generate.py`: sample text from a trained model; tokens stream to stdout as they are produced."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minigpt.checkpoints import load_model
from minigpt.common import UsageError
from minigpt.common.text import TextStream
from minigpt.model import generate_tokens, optimize_for_decoding
from minigpt.training.config import SampleConfig

from .command import USER_ERRORS, options_parser, parse_options, report


@dataclass(frozen=True)
class GenerateOptions:
    """Which model to sample from, where, and how many samples."""

    checkpoint: str
    """A run folder (its best checkpoint), a .ckpt or exported .safetensors file, or a GPT-2
    folder in the Hugging Face layout (config.json + weights; a hub name such as gpt2 is fetched)."""
    num_samples: int = 1
    """Independent samples to draw, one after the other."""
    device: str = "auto"
    """cpu, cuda, cuda:1, ... (auto: cuda when available)."""
    cache: bool = True
    """Reuse each step's keys and values (the KV cache); --no_cache recomputes the whole window
    every step, which gives the same tokens, slower."""
    tokenizer_path: str | None = None
    """GPT-2's r50k_base.tiktoken ranks file, on machines that cannot fetch it."""

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise UsageError(f"num_samples must be >= 1, got {self.num_samples}")


def generate_main(args: Sequence[str] | None = None) -> int:
    """Parse the command line, load the model, stream samples. Returns the exit code."""
    parser = options_parser(
        "generate.py",
        "Sample text from a trained minigpt model; tokens stream to stdout.",
        GenerateOptions,
        SampleConfig,
        max_new_tokens=200,  # a sample worth reading; training's validation samples are shorter
        top_k=None,
    )
    try:
        opts, sample = parse_options(parser, args, GenerateOptions, SampleConfig)
        if sample.prompt == "":
            raise UsageError("the prompt is empty: pass some text with --prompt (default is a newline)")
        device = ("cuda" if torch.cuda.is_available() else "cpu") if opts.device == "auto" else opts.device
        model, tokenizer = load_model(opts.checkpoint, device=device, tokenizer_path=opts.tokenizer_path)
        if device == "cpu":
            optimize_for_decoding(model)
        ids = tokenizer.encode(sample.prompt)
        context = model.config.context_length
        if len(ids) > context:
            print(
                f"warning: the prompt has {len(ids)} tokens; only its last {context} fit the context",
                file=sys.stderr,
            )
            ids = ids[-context:]
    except USER_ERRORS as err:
        return report(err)

    generator = torch.Generator(device=device).manual_seed(sample.seed)
    prompt = torch.tensor([ids], device=device)
    for n in range(opts.num_samples):
        if opts.num_samples > 1:
            sys.stdout.write(f"{'' if n == 0 else chr(10)}--- sample {n + 1} ---\n")
        sys.stdout.write(sample.prompt)
        stream = TextStream(tokenizer.decode)
        for token in generate_tokens(
            model,
            prompt,
            sample.max_new_tokens,
            **sample.sampling(),
            stop_token=tokenizer.eot_id,
            use_cache=opts.cache,
            generator=generator,
        ):
            if token.item() == tokenizer.eot_id:
                break
            sys.stdout.write(stream.push(token.item()))
            sys.stdout.flush()
        sys.stdout.write(stream.flush() + "\n")
        sys.stdout.flush()
    return 0
