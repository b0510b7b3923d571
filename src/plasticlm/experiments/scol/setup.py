"""What a SCoL experiment runs on: its config, the model, the world's files, the replay pool,
and the sandbox world's controls (legal answer sets, entity-swapped questions)."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Annotated, Literal

import torch

from plasticlm.config import Field, configclass, load_config, preset_path
from plasticlm.data.corpus import load_text_corpus
from plasticlm.data.longbench import load_longbench
from plasticlm.data.records import LongItem
from plasticlm.errors import PlasticError
from plasticlm.eval import swap_entity
from plasticlm.models import load_causal_lm
from plasticlm.runtime import dtype_name, pick_dtype, set_threads
from plasticlm.sandbox import (
    PRESETS,
    generate_world,
    get_preset,
    long_items,
    sandbox_model,
    sandbox_world,
)
from plasticlm.sandbox.domains import KINDS, entity_name
from plasticlm.sandbox.world_index import closed_value_sets, read_world_index
from plasticlm.scol.baselines import SCOL_METHODS
from plasticlm.scol.config import SCoLConfig
from plasticlm.scol.consolidate import context_windows, float32_master, pad_of, stack_windows

log = logging.getLogger("plasticlm.scol")

PresetName = Literal[tuple(PRESETS)]   # a sandbox preset, as a config choice


@configclass
class ExperimentConfig:
    """Data, model and sizes of an experiment; ``scol`` holds the method's own settings."""

    scol: SCoLConfig = Field(default_factory=SCoLConfig, description="SCoL's own settings")
    model: str = Field("", description="HF folder; empty = the sandbox receiver of preset")
    preset: PresetName = Field("sandbox", description="sandbox preset whose receiver and "
                               "world are used when model / squad / longbench are empty")
    squad: str = Field("", description="SQuAD v1.1 file; empty = the preset world's unseen "
                       "passages")
    longbench: str = Field("", description="LongBench v2 file; empty = the preset world's "
                           "items")
    train_streams: int = Field(4, ge=0, description="meta-training streams")
    stream_length: int = Field(6, ge=0, description="contexts per meta-training stream")
    eval_length: int = Field(24, ge=1, description="contexts of the evaluation stream")
    full_rows_every: int = Field(
        1, ge=1, description="every n-th row of the accuracy matrix (and the last) asks about "
        "every earlier context; the others ask only their newest one (immediate accuracy). 1 "
        "= the full matrix, whose cost grows with the square of eval_length")
    methods: tuple[Annotated[str, SCOL_METHODS.key], ...] = Field(
        SCOL_METHODS.names(), min_length=1, description="squad: the methods compared, in order")
    lambda0_outer_steps: int = Field(-1, ge=-1, description="outer steps of the lambda = 0 "
                                     "policy; -1: as many as scol.outer_steps")
    prompt_tokens: int = Field(384, ge=1, description="in-context baselines' token budget")
    fisher_top: int = Field(0, ge=0, description="size of the top-Fisher set; 0 = the "
                            "selection's size")
    held_out_pairs: bool = Field(
        True, description="score the meta-trained policy on held-out preference pairs: "
        "best-of-K from the untouched model over the evaluation stream, i.e. K more inner "
        "updates per evaluation context")
    chunk_tokens: int = Field(192, ge=8, description="longbench chunk size in tokens")
    longbench_per_length: int = Field(
        0, ge=0, description="longbench items per length regime drawn from the preset's world "
        "(0 = the world file's own items, or the file given as longbench)")
    max_chunks: int = Field(12, ge=1, description="longbench: chunks per stream at most "
                            "(short regime)")
    long_max_chunks: int = Field(24, ge=1, description="longbench: chunks per stream at most "
                                 "(long regime)")
    oracle_layers: int = Field(1, ge=1, description="oracle: the most layers of the sets "
                               "searched exhaustively at every context (each set is adapted "
                               "twice per context)")
    policy_train_contexts: int = Field(36, ge=1, description="policy: training contexts per "
                                       "seed (each gives up to C(C-1)/2 preference pairs)")
    policy_steps: int = Field(200, ge=1, description="policy: IPO steps per seed")
    policy_batch_contexts: int = Field(4, ge=1, description="policy: contexts per IPO step")
    policy_eval_every: int = Field(25, ge=1, description="policy: IPO steps between points "
                                   "of the learning curve")
    threads: int | None = Field(None, ge=1, description="torch threads; null: the command's "
                                "thread policy (--threads, $PLASTICLM_THREADS, else every core)")
    seed: int = Field(0, ge=0, description="seed of streams, samples and LoRA")
    seeds: int = Field(4, ge=1, description="squad: seeds seed, seed+1, ... run and pooled")

    def __post_init__(self):
        if self.longbench_per_length and self.longbench:
            raise PlasticError("longbench_per_length draws items from the sandbox world; it "
                               "cannot apply to a given longbench file (set one or the other)")


def quick_config() -> ExperimentConfig:
    """Sizes for a smoke test (seconds to a minute on a tiny model): the packaged preset
    ``configs/scol/quick.toml`` on the sandbox's "quick" models unless a model and data are
    given."""
    return load_config(ExperimentConfig, preset=preset_path("scol", "quick"))


def resolve_model(cfg: ExperimentConfig) -> Path:
    if cfg.model:
        return Path(cfg.model)
    return sandbox_model("receiver", cfg.preset)


def resolve_world_file(cfg: ExperimentConfig, kind: str) -> Path:
    given = cfg.squad if kind == "squad" else cfg.longbench
    if given:
        return Path(given)
    world = sandbox_world(cfg.preset)
    return world / ("squad/unseen.json" if kind == "squad" else "longbench/items.json")


def longbench_items(cfg: ExperimentConfig) -> list[LongItem]:
    """The LongBench experiment's items: the given file, the preset world's file, or
    ``longbench_per_length`` items per regime drawn from the preset's world."""
    if not cfg.longbench_per_length:     # never set together with a longbench file
        return load_longbench(resolve_world_file(cfg, "longbench"))
    world = generate_world(get_preset(cfg.preset).world)
    return long_items(world, cfg.longbench_per_length, seed=cfg.seed)


def replay_pool(cfg: ExperimentConfig, tokenizer):
    """Generic text the inner update may replay (``scol.lora.replay`` > 0): windows of the
    sandbox world's corpus documents; None for real data or when replay is off."""
    if cfg.scol.lora.replay <= 0 or cfg.squad:
        return None
    docs = load_text_corpus(sandbox_world(cfg.preset) / "corpus" / "train.txt")[:512]
    return stack_windows([context_windows(tokenizer, d.text, cfg.scol.lora.max_tokens)
                          for d in docs], pad_of(tokenizer))


def legal_sets(cfg: ExperimentConfig):
    """``question id -> legal values`` for the sandbox world's questions (ids are
    ``domain.split.n.attribute``); None for a real SQuAD file (open answers)."""
    if cfg.squad:
        return None
    sets = closed_value_sets(read_world_index(sandbox_world(cfg.preset)))

    def legal(qid: str) -> tuple[str, ...]:
        parts = qid.split(".")
        return sets.get((parts[0], parts[-1]), ())
    return legal


def swap_names(cfg: ExperimentConfig):
    """``(question_id, question, title) -> question`` about an unseen entity of the same
    kind (the sandbox world's names are avoided; one name per title, by seed); None for a
    real SQuAD file."""
    if cfg.squad:
        return None
    index = read_world_index(sandbox_world(cfg.preset))
    taken = {e["name"] for e in index["entities"]}
    names: dict[str, str] = {}

    def swap(qid: str, question: str, title: str) -> str:
        if title not in names:
            rng = random.Random(f"{cfg.seed}:{title}")
            name = entity_name(KINDS[qid.split(".")[0]], rng)
            while name in taken or name == title:
                name = entity_name(KINDS[qid.split(".")[0]], rng)
            names[title] = name
        try:
            return swap_entity(question, title, names[title])
        except ValueError:   # the question does not name its passage's entity
            return ""
    return swap


def load_model(cfg: ExperimentConfig):
    """``(model in float32 on the run's device, tokenizer)`` of the experiment, with
    ``cfg.threads`` threads when set (else the command's policy stands). Always float32: consolidation merges LoRA deltas into the
    weights, and deltas of 1e-4 relative vanish in bfloat16."""
    if cfg.threads is not None:
        set_threads(cfg.threads)
    if pick_dtype() != torch.float32:
        log.warning("SCoL consolidates into float32 weights: its models load in float32, "
                    "not %s", dtype_name(pick_dtype()))
    model, tok = load_causal_lm(resolve_model(cfg), dtype="float32")
    return float32_master(model), tok
