"""One member of a sandbox family: how it is built, saved, loaded and its losses reported."""

from __future__ import annotations

import json
import os
from pathlib import Path

from plasticlm.models import build_tiny, evaluate_loss, load_causal_lm, pack_corpus, unigram_loss
from plasticlm.runs import atomic_folder, write_text_atomic
from plasticlm.sandbox.presets import ModelSpec


def save_model_atomic(model, tokenizer, out: Path) -> None:
    """Save an HF folder (model and tokenizer) so that a crash never leaves half a model."""
    with atomic_folder(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def write_json_atomic(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1) + "\n")


def load_member(folder: Path):
    """A member in float32 on the CPU, whatever the command's --device/--dtype: the family
    (and its probe numbers) must not depend on the command that happened to build it."""
    return load_causal_lm(folder, dtype="float32", device="cpu")


def build_model(spec: ModelSpec, vocab_size: int, max_len: int):
    return build_tiny(spec.arch, seed=spec.seed, vocab_size=vocab_size,
                      hidden_size=spec.hidden_size, num_layers=spec.num_layers,
                      num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                      head_dim=spec.head_dim, intermediate_size=spec.intermediate_size,
                      max_position_embeddings=max_len)


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def loss_report(model, tokenizer, train_docs, valid_docs, seq_len: int) -> dict:
    train = pack_corpus(tokenizer, train_docs, seq_len)
    valid = pack_corpus(tokenizer, valid_docs, min(seq_len, 64))
    return {"valid_loss": round(evaluate_loss(model, valid), 4),
            "unigram_loss": round(unigram_loss(train, valid, len(tokenizer)), 4),
            "train_tokens": int(train[:, 1:].numel())}
