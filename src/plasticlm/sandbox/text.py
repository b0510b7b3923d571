"""``plasticlm models pretrain --text FILE``: one model on any plain-text corpus."""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from plasticlm.config import require_positive
from plasticlm.data.corpus import load_text_corpus
from plasticlm.errors import PlasticError
from plasticlm.models import describe, pack_corpus, train_bpe_tokenizer, train_lm
from plasticlm.runs import seed_everything
from plasticlm.sandbox.presets import ModelSpec
from plasticlm.sandbox.pretrain import build_model, loss_report, save_model_atomic


@dataclass(frozen=True)
class TextPretrainConfig:
    arch: str = "qwen3"
    vocab_size: int = 1024
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768
    steps: int = 300
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    seed: int = 0
    max_docs: int | None = None
    valid_fraction: float = 0.05

    def __post_init__(self):
        require_positive(self, "steps", "batch_size", "seq_len", "vocab_size", "hidden_size",
                         "num_layers")


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
