"""``plasticlm models pretrain --text FILE``: one model on any plain-text corpus."""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from plasticlm.config import Field, configclass
from plasticlm.data.corpus import load_text_corpus
from plasticlm.errors import PlasticError
from plasticlm.models import describe, pack_corpus, train_bpe_tokenizer, train_lm
from plasticlm.models.tiny import ARCHS
from plasticlm.runtime import seed_everything
from plasticlm.sandbox.presets import ModelSpec
from plasticlm.sandbox.pretrain import build_model, loss_report, save_model_atomic


@configclass
class TextPretrainConfig:
    """One tokenizer and one model trained on a plain-text corpus."""

    arch: Literal[ARCHS] = Field("qwen3", description="model architecture")
    vocab_size: int = Field(1024, gt=0, description="BPE vocabulary size")
    hidden_size: int = Field(256, gt=0, description="model width")
    num_layers: int = Field(4, gt=0, description="decoder layers")
    num_heads: int = Field(4, gt=0, description="attention heads")
    num_kv_heads: int = Field(2, gt=0, description="key/value heads (grouped-query attention)")
    head_dim: int = Field(64, gt=0, description="width of one head")
    intermediate_size: int = Field(768, gt=0, description="MLP width")
    steps: int = Field(300, gt=0, description="optimiser steps")
    batch_size: int = Field(16, gt=0, description="blocks per step")
    seq_len: int = Field(256, gt=0, description="tokens per training block")
    lr: float = Field(2e-3, gt=0, description="peak learning rate")
    seed: int = Field(0, description="seed of the split, the tokenizer and the model")
    max_docs: int | None = Field(None, gt=0, description="read at most this many documents "
                                 "(default: all)")
    valid_fraction: float = Field(0.05, ge=0, lt=1, description="share of the documents held "
                                  "out for the validation loss (at least one)")


def pretrain_text(text: str | Path, out: str | Path, cfg: TextPretrainConfig | None = None,
                  progress: bool = True) -> dict:
    """Train a BPE tokenizer and a model on a text corpus; save an HF folder with a report."""
    cfg = cfg or TextPretrainConfig()
    docs = [d.text for d in load_text_corpus(text, cfg.max_docs)]
    if len(docs) < 2:
        raise PlasticError(f"{text}: need at least 2 documents (separated by <|endoftext|>) to "
                           "hold one out for validation")
    rng = random.Random(cfg.seed)
    rng.shuffle(docs)
    n_valid = max(1, int(cfg.valid_fraction * len(docs)))
    valid, train = docs[:n_valid], docs[n_valid:]
    seed_everything(cfg.seed)
    t = time.time()
    tok = train_bpe_tokenizer(train, vocab_size=cfg.vocab_size)
    spec = ModelSpec("text", cfg.arch, "own", cfg.hidden_size, cfg.num_layers, cfg.num_heads,
                     cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.steps,
                     batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed)
    blocks = pack_corpus(tok, train, cfg.seq_len)
    model = build_model(spec, len(tok), max(2048, 4 * cfg.seq_len))
    losses = train_lm(model, blocks, cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr,
                      warmup=min(50, cfg.steps // 5 + 1), seed=cfg.seed, progress=progress)
    out = Path(out)
    save_model_atomic(model, tok, out)
    report = {"text": str(text), "config": asdict(cfg), "describe": describe(model),
              "train_seconds": round(time.time() - t, 1), "first_loss": round(losses[0], 4),
              "last_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4),
              **loss_report(model, tok, train, valid, cfg.seq_len)}
    (out / "pretrain_report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
