"""The model layer: load any HF causal LM, build tiny ones, import llama2.c, pre-train."""

from plasticlm.models.llama2c import from_llama2c, import_llama2c
from plasticlm.models.loading import (
    SUPPORTED_MODEL_TYPES,
    check_model_source,
    describe,
    load_causal_lm,
)
from plasticlm.models.pretrain import (
    evaluate_loss,
    pack_corpus,
    packed_batch,
    train_bpe_tokenizer,
    train_lm,
    train_lm_repacked,
    train_steps,
    unigram_loss,
)
from plasticlm.models.tiny import ARCHS, build_tiny, tiny_config

__all__ = [
    "ARCHS", "SUPPORTED_MODEL_TYPES", "build_tiny", "describe", "evaluate_loss",
    "from_llama2c", "import_llama2c", "load_causal_lm", "check_model_source", "pack_corpus",
    "packed_batch", "tiny_config", "train_bpe_tokenizer", "train_lm", "train_lm_repacked",
    "train_steps", "unigram_loss",
]
