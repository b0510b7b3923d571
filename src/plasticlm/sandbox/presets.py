"""Sandbox presets: the world, the tokenizers and the model family each preset trains.

``sandbox`` (v2) is a deeper, narrower family than v1 at about the same pre-training
compute: an 8-layer Qwen3 receiver, a 6-layer Llama and a 6-layer Qwen2 transmitter, and a
6-layer Llama specialist that mostly reads one domain's private facts. Two BPE tokenizers
(1,024 and 768 tokens, trained on different text) make cross-vocabulary paths real.
``quick`` is a seconds-long miniature for smoke tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from plasticlm.errors import PlasticError
from plasticlm.runs import cache_home
from plasticlm.sandbox.reading import ReadingMix
from plasticlm.sandbox.world import WorldConfig

SANDBOX_VERSION = 2


@dataclass(frozen=True)
class TokenizerSpec:
    name: str
    vocab_size: int
    corpus: str = "train"            # train | mixed (valid + specialist + half of train)


@dataclass(frozen=True)
class ModelSpec:
    """One model of the family: architecture, sizes, tokenizer, training budget."""

    name: str
    arch: str
    tokenizer: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    steps: int
    corpus: str = "train"            # train | specialist (specialist docs + some general)
    batch_size: int = 8
    lr: float = 2e-3
    seed: int = 0
    # Steps of fresh single-needle NIAH drills after pre-training (the corpus's fixed
    # drills are memorised rather than teaching the copy; see sandbox.drills).
    drill_steps: int = 0
    # Start from this earlier model of the preset (same architecture and tokenizer) and
    # continue training on ``corpus``: a specialist is a general model adapted to private
    # data, and needs no minutes to learn the language again.
    init_from: str = ""
    # Share of pre-training documents that are fresh reading documents (sandbox.reading,
    # with the preset's ``reading`` mix), packed afresh every step; 0 = the v2 recipe
    # (fixed blocks of the corpus).
    reading_share: float = 0.0


@dataclass(frozen=True)
class Preset:
    name: str
    world: WorldConfig
    tokenizers: tuple[TokenizerSpec, ...]
    models: tuple[ModelSpec, ...]
    seq_len: int = 256
    specialist_general_fraction: float = 0.3  # general docs per specialist doc
    # (task, length in tokens) probes of the receiver, inside its training length.
    niah: tuple[tuple[str, int], ...] = (("single", 128), ("single", 224), ("multikey", 224))
    niah_samples: int = 40
    drill_lengths: tuple[int, ...] = (64, 96, 128)   # tokens; probes go beyond them
    drill_batch_size: int = 16
    drill_lr: float = 1e-3
    # Share of drill steps that are reading drills (a made-up entity's passage, filler, a
    # question; see sandbox.drills), and their filler in words. Off in ``sandbox``: they left
    # open-book reading at chance and cost closed-book accuracy, the QA template coming to
    # mean "copy" (docs/sandbox.md).
    drill_reading_share: float = 0.0
    drill_reading_filler: tuple[int, int] = (0, 60)
    # Open-book probe of drilled models: the world's open-book items (40-80 filler words).
    openbook_filler: tuple[int, int] = (40, 80)
    openbook_samples: int = 200
    checkpoint_every: int = 50
    # Kinds and sizes of the reading documents of members with a ``reading_share``.
    reading: ReadingMix = ReadingMix()
    # Reading probes (sandbox.reading_probes): items per probe.
    reading_samples: int = 200
    reading_needle_tokens: int = 224
    version: int = SANDBOX_VERSION


PRESETS: dict[str, Preset] = {
    "sandbox": Preset(
        "sandbox", WorldConfig(seed=0),
        (TokenizerSpec("bpe1024", 1024, "train"), TokenizerSpec("bpe768", 768, "mixed")),
        (ModelSpec("receiver", "qwen3", "bpe1024", 192, 8, 4, 2, 48, 512, steps=480,
                   drill_steps=200),
         ModelSpec("transmitter-llama", "llama", "bpe768", 128, 6, 4, 2, 32, 352, steps=250,
                   seed=1),
         ModelSpec("transmitter-qwen2", "qwen2", "bpe1024", 96, 6, 4, 2, 24, 256, steps=200,
                   seed=2),
         ModelSpec("specialist", "llama", "bpe768", 128, 6, 4, 2, 32, 352, steps=700,
                   corpus="specialist", lr=5e-3, seed=3, init_from="transmitter-llama")),
        specialist_general_fraction=0.05),
    "quick": Preset(
        "quick",
        WorldConfig(seed=0, core_per_domain=8, unseen_per_domain=2, specialist_entities=8,
                    max_mentions=3, drills=6, longbench_per_length=1,
                    longbench_words=(120, 200, 300), streams=1, stream_length=3),
        (TokenizerSpec("bpe320", 320, "train"), TokenizerSpec("bpe300", 300, "mixed")),
        (ModelSpec("receiver", "qwen3", "bpe320", 32, 2, 2, 1, 16, 64, steps=3, batch_size=4,
                   drill_steps=2),
         ModelSpec("transmitter-llama", "llama", "bpe300", 32, 2, 2, 2, 16, 64, steps=2,
                   batch_size=4),
         ModelSpec("specialist", "llama", "bpe300", 32, 2, 2, 2, 16, 64, steps=2,
                   batch_size=4, corpus="specialist", init_from="transmitter-llama")),
        seq_len=64, niah=(("single", 160),), niah_samples=2, drill_lengths=(48,),
        drill_batch_size=2, openbook_samples=8, checkpoint_every=1),
    # v3: every member pre-trains on the world's corpus mixed with fresh reading documents
    # (sandbox.reading) in rows of 512 tokens that hold whole documents (the probes run to
    # about 410 tokens), from the first step: half the documents are reading documents with
    # 4-8 questions a passage and the loss on the answers only, and each world-corpus token
    # weighs 0.25 in the loss against an answer token's 1 (at weight 1 the answers were one
    # loss token in five and reading had not started by 1,500 steps, row r4); a 16-layer
    # receiver, trained last. Chosen by the experiments in docs/sandbox.md ("Sandbox v3",
    # row r7: at 4 x 128 and 3,000 steps core MC 72.9%, open-book 87.5%, where r5's
    # curriculum had 25.0% / 55.0%; seeds 1 and 2, r10 and r12: MC 60.4% / 55.4%, open-book
    # 38.8% / 47.5%, the reading's onset varies by seed; 16 x 96, r8: open-book 91.2%,
    # MC 43.3%).
    "sandbox-v3": Preset(
        "sandbox-v3", WorldConfig(seed=0),
        (TokenizerSpec("bpe1024", 1024, "train"), TokenizerSpec("bpe768", 768, "mixed")),
        (ModelSpec("transmitter-llama", "llama", "bpe768", 128, 6, 4, 2, 32, 352, steps=4000,
                   batch_size=4, seed=1, reading_share=0.5),
         ModelSpec("transmitter-qwen2", "qwen2", "bpe1024", 96, 6, 4, 2, 24, 256, steps=4000,
                   batch_size=4, seed=2, reading_share=0.5),
         ModelSpec("specialist", "llama", "bpe768", 128, 6, 4, 2, 32, 352, steps=1000,
                   batch_size=4, corpus="specialist", lr=4e-3, seed=3,
                   init_from="transmitter-llama", reading_share=0.15),
         ModelSpec("receiver", "qwen3", "bpe1024", 128, 16, 4, 2, 32, 384, steps=8000,
                   batch_size=4, reading_share=0.5)),
        seq_len=512, specialist_general_fraction=0.05, checkpoint_every=100,
        reading=ReadingMix(share=0.5, kinds=(("stated", 0.2), ("openbook", 0.4),
                                             ("distractors", 0.2), ("multikey", 0.1),
                                             ("vartrack", 0.1)),
                           filler_words=(-80, 80), questions=(4, 8), context_loss=False,
                           world_weight=0.25),
        version=3),
    # A seconds-long v3 miniature for tests.
    "quick-v3": Preset(
        "quick-v3",
        WorldConfig(seed=0, core_per_domain=8, unseen_per_domain=2, specialist_entities=8,
                    max_mentions=3, drills=6, longbench_per_length=1,
                    longbench_words=(120, 200, 300), streams=1, stream_length=3),
        (TokenizerSpec("bpe320", 320, "train"),),
        (ModelSpec("receiver", "qwen3", "bpe320", 32, 2, 2, 1, 16, 64, steps=3, batch_size=4,
                   reading_share=0.5),
         ModelSpec("specialist", "qwen3", "bpe320", 32, 2, 2, 1, 16, 64, steps=2,
                   batch_size=4, corpus="specialist", init_from="receiver",
                   reading_share=0.2)),
        seq_len=64, niah=(("single", 160),), niah_samples=2, openbook_samples=8,
        reading=ReadingMix(needle_tokens=(320, 400), warmup_steps=1, ramp_steps=1,
                           world_weight=0.25),
        reading_samples=8,
        reading_needle_tokens=400, checkpoint_every=1, version=3),
}


def _check(p: Preset) -> Preset:
    seen: dict[str, ModelSpec] = {}
    for m in p.models:
        parent = seen.get(m.init_from) if m.init_from else m
        if parent is None or (parent.arch, parent.tokenizer, parent.hidden_size,
                              parent.num_layers) != (m.arch, m.tokenizer, m.hidden_size,
                                                     m.num_layers):
            raise PlasticError(f"preset {p.name!r}: model {m.name!r} starts from "
                               f"{m.init_from!r}, which is not an earlier model of the same "
                               "architecture, sizes and tokenizer")
        seen[m.name] = m
    return p


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise PlasticError(f"unknown pretrain preset {name!r}; choose one of {', '.join(PRESETS)}")
    return _check(PRESETS[name])


def preset_dir(preset: str = "sandbox") -> str:
    """Where a preset's world and models live: ``cache_home()/models/sandbox[-<preset>]-v<N>``
    (``sandbox-v3`` for the preset of that name). Folders carry the version, so an older
    family is never mistaken for them."""
    name = preset if preset.startswith("sandbox") else f"sandbox-{preset}"
    version = f"-v{get_preset(preset).version}"
    return cache_home() / "models" / (name if name.endswith(version) else name + version)
