#!/usr/bin/env python
"""Which tokenizer a config should train with, scored in validation bits per byte.

Nats per token do not compare across tokenizers (a token is a character for one, a word for
another); bits per byte do: the validation loss summed over the target tokens, in bits, over the
UTF-8 bytes those targets stand for, summed as validation sums them
(`minigpt.evaluation.metrics.BitsPerByte`: an end-of-text target stands for no bytes, and its loss
is left out). Each contestant is `train.py --config <config>` with its tokenizer and everything
else as the config has it, for the same `--steps` (warmup scaled as benchmarks/ablation.py scales
it), one after another. Then, for each run's final weights (the config's moving average where it
keeps one), this script scores every validation target of the run's own prepared data
(`val_offsets`: windows back to back over the split, as validation runs) in the config's
precision. The validation splits differ a little between tokenizers (each is the last
`val_fraction` of its own token stream, after any text a learned vocabulary saw); the table
gives their bytes. Step times are measured separately, in one process with the contestants taking
turns (`suite.runs.step_timer`, on random ids), since the runs themselves are timed on a shared
machine.

    python benchmarks/tokenizer_bpb.py --config small.yaml --steps 300 --text tinyshakespeare.txt
    python benchmarks/tokenizer_bpb.py --contestants gpt2-compact,bpe:4096 --steps 100
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
from pathlib import Path

import torch

from minigpt.checkpoints import load_model
from minigpt.data import DataConfig, PreparedData, prepare, tokenizer_from_spec
from minigpt.data.windows import TokenWindows, val_offsets
from minigpt.evaluation.metrics import BitsPerByte
from minigpt.model import GPT
from minigpt.training.allocator import keep_freed_memory
from minigpt.training.precision import resolve_precision

from suite.configs import cli_overrides, config_path, precision, read_yaml
from suite.runs import log, step_timer, train


@torch.no_grad()
def bits_per_byte(model: GPT, prepared: PreparedData, bf16: bool, batch_size: int = 32) -> dict[str, float]:
    """Bits per byte of ``model`` over every validation target of ``prepared`` (see the module text)."""
    score = BitsPerByte(prepared.tokenizer().byte_lengths())
    T = model.config.context_length
    windows = TokenWindows(prepared.segments("val"), prepared.meta["dtype"], T)
    offsets = val_offsets(windows)
    for begin in range(0, len(offsets), batch_size):
        x, y = map(torch.stack, zip(*(windows[i] for i in offsets[begin : begin + batch_size]), strict=True))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        losses = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), y.flatten(), reduction="none"
        )
        score.update(losses, y)
    total = {name: value.item() for name, value in score.compute().items()}
    return {
        "bpb": total["bpb"],
        "nats_per_token": total["loss"],
        "val_targets": int(total["targets"]),
        "val_bytes": int(total["bytes"]),
    }


def contestant_settings(name: str) -> dict[str, object]:
    """`gpt2-compact`, `char`, `bpe:4096`: the tokenizer and its vocabulary size, as dotted settings."""
    tokenizer, _, size = name.partition(":")
    return {"data.config.tokenizer": tokenizer, **({"data.config.vocab_size": int(size)} if size else {})}


def prepared_for(config: dict, source: str, cache: Path, settings: dict[str, object]) -> PreparedData:
    data = {**config["data"]["config"], "source": source, "cache_dir": str(cache)}
    data.update({k.removeprefix("data.config."): v for k, v in settings.items()})
    return prepare(DataConfig(**data))


def step_speeds(config: dict, vocab: dict[str, int], rounds: int, steps: int) -> dict[str, float]:
    """Each contestant's steps per second relative to the first's, timed in turns in this process
    after the runs (the fastest step of each: other work on the machine only ever adds time)."""
    keep_freed_memory()  # as train.py does
    timers = {name: step_timer(config, {}, size) for name, size in vocab.items()}
    for timer in timers.values():
        timer(), timer()  # warm up
    fastest = dict.fromkeys(timers, float("inf"))
    order = list(timers)
    for r in range(rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            fastest[name] = min(fastest[name], *(timers[name]() for _ in range(steps)))
    first = order[0]
    return {name: fastest[first] / fastest[name] for name in order}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="small.yaml")
    p.add_argument("--text", default=None, help="a UTF-8 text file (default: the built-in corpus)")
    p.add_argument("--steps", type=int, default=300, help="training steps of every contestant")
    p.add_argument("--contestants", default="gpt2-compact,bpe:4096,char,bpe:8192,bpe:2048")
    p.add_argument("--rounds", type=int, default=3, help="timing rounds, the contestants taking turns")
    p.add_argument("--timed-steps", type=int, default=3, help="steps timed per contestant and round")
    p.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    p.add_argument("--timing-only", action="store_true", help="print the relative step speeds and stop")
    p.add_argument(
        "--speeds",
        default=None,
        help="the same wall-clock time for each: name=speed,... as --timing-only printed (relative to the"
        " contestant --steps is for); a contestant then trains --steps x its speed steps",
    )
    args = p.parse_args()
    args.source = str(Path(args.text).resolve()) if args.text else "shakespeare"
    args.config, args.over = config_path(args.config), None
    config = read_yaml(args.config)
    names = [c for c in args.contestants.split(",") if c]
    full_steps = int(config["trainer"]["max_steps"])
    warmup = int(config["model"].get("optim", {}).get("warmup_steps", 0))
    bf16 = resolve_precision(precision(config)) == "bf16-mixed"
    speeds = (
        {k: float(v.rstrip("%")) for k, v in (x.rsplit("=", 1) for x in args.speeds.split(","))}
        if args.speeds
        else {}
    )
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="minigpt-tokenizers-") as tmp:
        work = Path(tmp)
        cache = work / "data"
        if args.timing_only:
            vocab = {n: prepared_for(config, args.source, cache, contestant_settings(n)).meta for n in names}
            sizes = {n: tokenizer_from_spec(meta["tokenizer"]).n_vocab for n, meta in vocab.items()}
            speed = step_speeds(config, sizes, args.rounds, args.timed_steps)
            print("\n".join(f"{n}: {sizes[n]:,} ids, step speed {speed[n]:.0%}" for n in names), flush=True)
            return
        for name in names:
            prepared = prepared_for(config, args.source, cache, contestant_settings(name))
            steps = round(args.steps * speeds.get(name, 1.0))
            extra = {
                "trainer.max_steps": steps,
                "trainer.val_check_interval": steps,
                "model.optim.warmup_steps": max(1, round(warmup * steps / full_steps)),
                **contestant_settings(name),
            }
            run = train(args, work, name.replace(":", "-"), cli_overrides(extra))
            model, tokenizer = load_model(work / name.replace(":", "-"))
            meta = prepared.meta
            row = {"name": name, "vocab": tokenizer.n_vocab, **run, **bits_per_byte(model, prepared, bf16)}
            row["bytes_per_token"] = meta["text_bytes"] / (meta["train_tokens"] + meta["val_tokens"])
            log(f"[{name}] {row}")
            rows.append(row)
            write_table(args, names, rows)  # as each run ends, so a long benchmark shows its progress
        speed = speeds or step_speeds(
            config, {r["name"]: r["vocab"] for r in rows}, args.rounds, args.timed_steps
        )
        for row in rows:
            row["speed"] = speed[row["name"]]
        write_table(args, names, rows)


def write_table(args: argparse.Namespace, names: list[str], rows: list[dict]) -> None:
    """The markdown table of the runs so far, printed and written to --out."""
    lines = [
        f"`python benchmarks/tokenizer_bpb.py --config {Path(args.config).name} --steps {args.steps}"
        + (f" --text {Path(args.text).name}" if args.text else "")
        + (f" --speeds {args.speeds}" if args.speeds else "")
        + f" --contestants {args.contestants}`,"
        f" {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()},"
        f" {os.cpu_count()} cores, torch {torch.__version__}; step speed relative to "
        + ("the --steps reference, " if args.speeds else f"{names[0]}: ")
        + ("as given" if args.speeds else f"fastest of {args.rounds} rounds x {args.timed_steps} steps"),
        "",
        "| tokenizer | vocab | bytes/token | step speed | steps | val nats/token | val bytes | **bpb** |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        speed = f"{r['speed']:.0%}" if "speed" in r else "(timed at the end)"
        lines.append(
            f"| {r['name']} | {r['vocab']:,} | {r['bytes_per_token']:.2f} | {speed} | {r['steps']} |"
            f" {r['nats_per_token']:.3f} (logged {r['val_loss']:.3f}) | {r['val_bytes']:,} |"
            f" **{r['bpb']:.3f}** |"
        )
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
