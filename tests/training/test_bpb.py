"""val_bpb, the validation loss in bits per byte of text, against a computation by hand: the
model's log-probabilities of the targets, summed, over the UTF-8 bytes of the text they spell."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lightning as L
import pytest
import tiktoken
import torch
import torch.nn.functional as F

from minigpt.data import DataConfig, TextDataModule
from minigpt.model import GPTConfig
from minigpt.training.lit import LitGPT

GPT = GPTConfig(context_length=16, n_layer=1, n_head=2, n_embd=32)

# Characters of one, two, three and four bytes, so bytes per token vary from window to window.
TEXT = "Où est la clé? Ça coûte 3 € — “merci” 😀. " * 4


def validate(config: DataConfig, fused_loss: bool = False) -> tuple[LitGPT, TextDataModule, dict]:
    data = TextDataModule(config, context_length=GPT.context_length)
    torch.manual_seed(0)
    lit = LitGPT(GPT, fused_loss=fused_loss)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    (metrics,) = trainer.validate(lit, datamodule=data, verbose=False)
    return lit, data, metrics


def by_hand(lit: LitGPT, data: TextDataModule, text_bytes) -> tuple[float, float]:
    """(mean loss per target, bits per byte): every target's negative log-probability from the
    model's logits; bits per byte over the targets that are not end-of-text, whose bytes
    `text_bytes(targets)` counts from the text they decode to."""
    eot = data.tokenizer.eot_id
    total, targets, text_total, nbytes = 0.0, 0, 0.0, 0
    with torch.no_grad():
        for x, y in data.val_dataloader():
            logp = F.log_softmax(lit.model(x).double(), dim=-1)
            nll = -logp.gather(-1, y[..., None])[..., 0]
            total, targets = total + nll.sum().item(), targets + y.numel()
            for row_nll, row in zip(nll, y, strict=True):
                text = row != eot if eot is not None else torch.ones_like(row, dtype=torch.bool)
                text_total += row_nll[text].sum().item()
                nbytes += text_bytes(row[text].tolist())
    return total / targets, text_total / (math.log(2) * nbytes)


def test_val_bpb_of_a_char_model_is_its_loss_over_the_text_bytes(tmp_path: Path) -> None:
    corpus = tmp_path / "text.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    cache = str(tmp_path / "cache")
    config = DataConfig(source=str(corpus), tokenizer="char", cache_dir=cache, batch_size=2, val_fraction=0.5)
    lit, data, metrics = validate(config)
    # 5 windows of validation targets in batches of 2: the last batch is smaller, and must weigh less.
    assert len(data.val_dataloader()) == 3
    loss, bpb = by_hand(lit, data, lambda ids: len(data.tokenizer.decode(ids).encode("utf-8")))
    assert metrics["val_loss"] == pytest.approx(loss, rel=1e-5)
    assert metrics["val_bpb"] == pytest.approx(bpb, rel=1e-5)
    assert metrics["val_ppl"] == pytest.approx(math.exp(loss), rel=1e-5)
    # Many characters are several bytes: a bit per byte is well under a bit per character here.
    assert metrics["val_bpb"] < 0.8 * metrics["val_loss"] / math.log(2)


def test_val_bpb_of_a_bpe_model_leaves_out_end_of_text(
    tmp_path: Path, gpt2_encoding: tiktoken.Encoding
) -> None:
    # Three documents: end-of-text tokens between them, which stand for no text. GPT-2's tokens
    # split the emoji and the euro sign into pieces of a character.
    corpus = tmp_path / "docs.jsonl"
    documents = [TEXT[i:] + TEXT[:i] for i in (0, 7, 19)]
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents), encoding="utf-8")
    config = DataConfig(
        source=str(corpus),
        tokenizer="gpt2-compact",
        cache_dir=str(tmp_path / "cache"),
        batch_size=3,
        val_fraction=0.5,
    )
    lit, data, metrics = validate(config, fused_loss=True)
    gpt2_ids = data.tokenizer.gpt2_ids
    eot = data.tokenizer.eot_id
    assert any(eot in y.flatten().tolist() for _, y in data.val_dataloader())
    loss, bpb = by_hand(lit, data, lambda ids: len(gpt2_encoding.decode_bytes(gpt2_ids[ids].tolist())))
    assert metrics["val_loss"] == pytest.approx(loss, rel=1e-5)
    assert metrics["val_bpb"] == pytest.approx(bpb, rel=1e-5)
