"""The methods the squad experiment compares, one registered class each (``SCOL_METHODS``, the
only list of them: ``methods`` in an experiment config names them): SCoL, its controls and
the baselines on the same streams and budget. Each carries how it runs (it fills the
accuracy matrix over the evaluation stream), its label in the tables, the meta-trained
policy it starts from and the paper's numbers where the paper reports it. Add one with
``@SCOL_METHODS.register(name)`` on a :class:`Method` subclass.

Besides the methods that commit a LoRA update per context (selections of
:func:`plasticlm.scol.stream.consolidate_stream`): context in the prompt, a running summary
in the prompt, batch test-time training on all contexts at once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from plasticlm.eval import generate_texts
from plasticlm.registry import Registry
from plasticlm.scol.config import SCoLConfig
from plasticlm.scol.consolidate import (
    LoraTrainConfig,
    adapt_lora,
    context_windows,
    num_layers_of,
    pad_of,
    stack_windows,
)
from plasticlm.scol.matrix import AccuracyMatrix
from plasticlm.scol.records import Context
from plasticlm.scol.stream import StepRecord, consolidate_stream

SCOL_METHODS: Registry[type[Method]] = Registry("SCoL method")


def in_context_prefix(tokenizer, contexts: Sequence[Context], max_tokens: int) -> str:
    """The most recent contexts that fit in ``max_tokens`` tokens, oldest first, as a prompt
    prefix (a context that does not fit whole is dropped with everything before it)."""
    kept: list[str] = []
    used = 0
    for c in reversed(contexts):
        n = len(tokenizer(c.text + "\n", add_special_tokens=False)["input_ids"])
        if used + n > max_tokens:
            break
        kept.append(c.text)
        used += n
    return "".join(t + "\n" for t in reversed(kept))


def summary_prompt(summary: str, context: str) -> str:
    return f"Notes: {summary}\nNew text: {context}\nUpdated notes:"


@torch.no_grad()
def running_summaries(model, tokenizer, contexts: Sequence[Context], max_new_tokens: int = 48
                      ) -> list[str]:
    """The model's notes after each context: it rewrites its notes with each new context
    (greedy, ``max_new_tokens`` at most); entry t is the notes after contexts 0..t."""
    summary, out = "", []
    for c in contexts:
        summary = generate_texts(model, tokenizer, [summary_prompt(summary, c.text)],
                                 max_new_tokens=max_new_tokens, stop=("\nNew text:",))[0].strip()
        out.append(summary)
    return out


def batch_ttt(model, tokenizer, contexts: Sequence[Context], cfg: LoraTrainConfig,
              seed: int = 0):
    """Test-time training on all contexts at once: LoRA on every layer, one run with the
    stream's budget (``cfg.steps`` steps per context, each on one random context, so the
    same updates and tokens as sequential fine-tuning), merged. Returns the model."""
    all_windows = stack_windows([context_windows(tokenizer, c.text, cfg.max_tokens)
                                 for c in contexts], pad_of(tokenizer))
    budget = replace(cfg, steps=cfg.steps * len(contexts))
    merged, _ = adapt_lora(model, range(num_layers_of(model)), all_windows, budget, seed,
                           rows_per_step=max(1, all_windows.shape[1] // len(contexts)))
    return merged


def best_fixed_layer(base, tokenizer, train: Sequence[Sequence[Context]], cfg,
                     replay=None) -> list[float]:
    """Per layer, the mean over the training streams of (immediate + retention) / 2 (F1)
    when every context commits that one layer: the fixed rule a policy must beat, chosen on
    the same streams the policy meta-trains on."""
    scores = []
    for layer in range(num_layers_of(base)):
        per_stream = []
        for s in train:
            mat = AccuracyMatrix(s)
            consolidate_stream(copy.deepcopy(base), tokenizer, s, cfg.scol, "fixed",
                               on_commit=lambda t, m, mat=mat: mat.add_row(m, tokenizer, t),
                               layers=(layer,), desc=f"fixed layer {layer}", replay=replay)
            f1 = mat.summary()["f1"]
            per_stream.append(((f1["immediate"] or 0) + (f1["retention"] or 0)) / 2)
        scores.append(sum(per_stream) / max(1, len(per_stream)))
    return scores


def _full_row(t: int, cfg) -> bool:
    return (t + 1) % cfg.full_rows_every == 0


class Method:
    """A method of the squad experiment (``cfg`` below is its ExperimentConfig)."""

    label = ""              # how the tables name it
    paper: dict = {}        # the paper's immediate / retention accuracy, where reported
    # the meta-trained policy it starts from, named after the method whose meta_config
    # trains it (None: the untouched model)
    policy: str | None = None
    # work on the training streams before the evaluation stream, as a classmethod
    # (base, tokenizer, train, cfg, replay, policies, report) filling ``policies``
    prepare: Callable | None = None

    @classmethod
    def meta_config(cls, cfg) -> SCoLConfig:
        """The settings its own policy meta-trains with (a method named as a ``policy``)."""
        return cfg.scol

    @classmethod
    def run(cls, name: str, mat: AccuracyMatrix, base, policies: dict, tokenizer,
            stream: Sequence[Context], cfg, replay) -> list[StepRecord] | None:
        """Fill ``mat`` over ``stream``; a method that commits updates returns its records."""
        raise NotImplementedError


class Consolidating(Method):
    """One LoRA commit per context with a selection rule, from the untouched model or from
    the meta-trained ``policy``."""

    selection = "greedy"

    @classmethod
    def layers(cls, base, policies: dict) -> tuple[int, ...] | None:
        """A fixed rule's layers."""
        return None

    @classmethod
    def run(cls, name, mat, base, policies, tokenizer, stream, cfg, replay):
        start = policies.get(cls.policy, base) if cls.policy else base
        _, records, _ = consolidate_stream(
            copy.deepcopy(start), tokenizer, stream, cfg.scol, cls.selection,
            on_commit=lambda t, model: mat.add_row(model, tokenizer, t, full=_full_row(t, cfg)),
            desc=name, layers=cls.layers(base, policies), replay=replay)
        return records


@SCOL_METHODS.register("scol")
class SCoL(Consolidating):
    label = "SCoL (meta-trained policy, greedy)"
    paper = {"immediate": 0.3540, "retention": 0.2046}
    policy = "scol"


@SCOL_METHODS.register("untrained_policy")
class UntrainedPolicy(Consolidating):
    label = "untrained policy, greedy"


@SCOL_METHODS.register("fixed_last")
class FixedLast(Consolidating):
    label = "fixed: last layer"
    selection = "fixed"

    @classmethod
    def layers(cls, base, policies):
        return (num_layers_of(base) - 1,)


@SCOL_METHODS.register("fixed_best")
class FixedBest(Consolidating):
    label = "fixed: best single layer (train)"
    selection = "fixed"

    @classmethod
    def prepare(cls, base, tokenizer, train, cfg, replay, policies, report):
        per_layer = best_fixed_layer(base, tokenizer, train, cfg, replay)
        policies["best_layer"] = max(range(len(per_layer)), key=per_layer.__getitem__)
        report["fixed_best"] = {"layer": policies["best_layer"], "train_score": per_layer}

    @classmethod
    def layers(cls, base, policies):
        return (policies.get("best_layer", 0),)


@SCOL_METHODS.register("scol_random")
class SCoLRandom(Consolidating):
    label = "random layers (same sizes)"
    selection, policy = "random", "scol"


@SCOL_METHODS.register("scol_lambda0")
class SCoLLambda0(Consolidating):
    label = "SCoL lambda = 0"
    paper = {"immediate": 0.3430, "retention": 0.1464}
    policy = "scol_lambda0"

    @classmethod
    def meta_config(cls, cfg):
        mcfg = replace(cfg.scol, lam=0.0)
        if cfg.lambda0_outer_steps >= 0:
            mcfg = replace(mcfg, outer_steps=cfg.lambda0_outer_steps)
        return mcfg


@SCOL_METHODS.register("sequential_ft")
class SequentialFT(Consolidating):
    label = "sequential fine-tuning (all layers)"
    paper = {"retention": 0.0130}
    selection = "all"


@SCOL_METHODS.register("sequential_ft_no_replay")
class SequentialFTNoReplay(SequentialFT):
    """The paper's forgetting baseline as it runs it: every layer, and no generic text
    replayed beside the context (the other rows replay ``scol.replay`` windows)."""

    label = "sequential fine-tuning (all layers), no replay"

    @classmethod
    def run(cls, name, mat, base, policies, tokenizer, stream, cfg, replay):
        return super().run(name, mat, base, policies, tokenizer, stream, cfg, None)


@SCOL_METHODS.register("batch_ttt")
class BatchTTT(Method):
    """One training run on all contexts: only the last row exists; the diagonal of a single
    row is its last entry, so immediate is reported from the same run (its final accuracy)."""

    label = "batch test-time training (final)"
    paper = {"immediate": 0.2652}

    @classmethod
    def run(cls, name, mat, base, policies, tokenizer, stream, cfg, replay):
        trained = batch_ttt(base, tokenizer, stream, cfg.scol.lora, cfg.seed)
        mat.add_row(trained, tokenizer, len(stream) - 1)
        mat.em = [mat.em[0][: i + 1] for i in range(len(stream) - 1)] + mat.em
        mat.f1 = [mat.f1[0][: i + 1] for i in range(len(stream) - 1)] + mat.f1
        if mat.swap_last:
            mat.swap_diag = list(mat.swap_last)


@SCOL_METHODS.register("prompting")
class Prompting(Method):
    label = "context in the prompt"
    paper = {"immediate": 0.2817}

    @classmethod
    def run(cls, name, mat, base, policies, tokenizer, stream, cfg, replay):
        for t in range(len(stream)):
            mat.add_row(base, tokenizer, t, in_context_prefix(tokenizer, stream[: t + 1],
                                                              cfg.prompt_tokens),
                        full=_full_row(t, cfg))


@SCOL_METHODS.register("summarisation")
class Summarisation(Method):
    label = "running notes in the prompt"

    @classmethod
    def run(cls, name, mat, base, policies, tokenizer, stream, cfg, replay):
        for t, note in enumerate(running_summaries(base, tokenizer, stream)):
            mat.add_row(base, tokenizer, t, note + "\n" if note else "", full=_full_row(t, cfg))
