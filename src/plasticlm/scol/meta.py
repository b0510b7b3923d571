"""SCoL's inner loop (consolidate a stream) and outer loop (IPO on the policy theta_0).

Inner loop, per context: the running model (the policy, drifted by earlier commits) writes
K layer selections; each is adapted with LoRA on a copy; the best by reward is committed;
candidate pairs with different rewards become IPO preference pairs. Outer loop: IPO updates
the pre-adaptation weights theta_0 against a frozen copy of them taken at each outer step.
"""


from __future__ import annotations

import copy
import json
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from plasticlm.errors import PlasticError
from plasticlm.eval import encode_with_bos
from plasticlm.models import load_causal_lm
from plasticlm.runs import RunDir
from plasticlm.scol.candidates import adapt_lora_together
from plasticlm.scol.checkpoint import check_resumable, load_optimizer, save_checkpoint
from plasticlm.scol.consolidate import (
    LoraTrainConfig,
    adapt_lora,
    context_windows,
    float32_master,
    num_layers_of,
    pad_of,
    with_replay,
)
from plasticlm.scol.contexts import Context
from plasticlm.scol.ipo import (
    PreferencePair,
    ipo_update,
    pairs_from_json,
    pairs_to_json,
    preference_pairs,
)
from plasticlm.scol.policy import (
    LayerGrammar,
    action_prompt,
    sample_actions,
)
from plasticlm.scol.rewards import (
    FORGET_FROM,
    Reward,
    RewardProbe,
)

SELECTIONS = ("best", "greedy", "random", "all", "fixed")


@dataclass
class SCoLConfig:
    """Inner loop (candidates, reward, LoRA) and outer loop (IPO) settings."""

    k: int = 4                     # candidate selections per context
    temperature: float = 1.0       # sampling temperature of candidates
    max_layers: int = 2            # most layers one action may name
    reward: str = "supervised"     # supervised (QA) | intrinsic (likelihood)
    lam: float = 1.0               # weight of forgetting in the reward
    qa_metric: str = "f1"          # em | f1, for the supervised reward
    forget_window: int = 4         # earlier contexts checked for forgetting
    # which of them: "recent" = the last forget_window; "all" = a sample of forget_window
    # drawn (by seed and position) from every earlier context of the stream, so that a long
    # stream's reward sees damage to its first contexts at the same cost
    forget_from: str = "recent"
    lora: LoraTrainConfig = field(default_factory=LoraTrainConfig)
    outer_steps: int = 8
    ipo_tau: float = 0.1
    ipo_lr: float = 5e-5
    ipo_epochs: int = 2
    # IPO's reference: "initial" = the policy before meta-training, fixed for every outer step
    # (IPO as specified); "step" = a copy taken at the start of each outer step
    ipo_reference: str = "initial"
    pair_buffer: int = 512         # preference pairs kept across outer steps (newest first);
                                   # 0 = only the current step's pairs
    diversity: float = 0.0         # weight of the constrained-entropy bonus
    prompt_chars: int = 1500
    together: bool = True          # train the K candidates in one batch (candidates.py)
    seed: int = 0

    def check(self, num_layers: int | None = None) -> None:
        if self.reward not in ("supervised", "intrinsic"):
            raise PlasticError(f"reward must be 'supervised' or 'intrinsic', not {self.reward!r}")
        if self.k < 1 or self.max_layers < 1:
            raise PlasticError("k and max_layers must be >= 1")
        if self.ipo_tau <= 0:
            raise PlasticError(f"ipo_tau must be > 0, not {self.ipo_tau}")
        if self.ipo_reference not in ("initial", "step"):
            raise PlasticError(f"ipo_reference must be 'initial' or 'step', not "
                               f"{self.ipo_reference!r}")
        if self.forget_from not in FORGET_FROM:
            raise PlasticError(f"forget_from must be one of {FORGET_FROM}, not "
                               f"{self.forget_from!r}")
        if self.pair_buffer < 0:
            raise PlasticError(f"pair_buffer must be >= 0, not {self.pair_buffer}")
        if num_layers is not None and self.max_layers > num_layers:
            raise PlasticError(f"max_layers {self.max_layers} exceeds the model's "
                               f"{num_layers} layers")


@dataclass
class StepRecord:
    """What happened at one context of a stream."""

    index: int
    context_id: str
    layers: tuple[int, ...]
    reward: Reward | None
    candidates: list[dict]
    seconds: float


def consolidate_stream(model, tokenizer, contexts: Sequence[Context], cfg: SCoLConfig,
                       selection: str = "best",
                       on_commit: Callable[[int, object], None] | None = None,
                       progress: bool = False, desc: str = "consolidate",
                       layers: Sequence[int] | None = None, replay: torch.Tensor | None = None
                       ) -> tuple[object, list[StepRecord], list[PreferencePair]]:
    """Write every context of a stream into the weights, one commit per context.

    ``selection``: ``best`` (K sampled candidates, the best by reward committed, preference
    pairs collected), ``greedy`` (the policy's greedy action, no reward needed), ``random``
    (random layers, as many as the greedy action names), ``all`` (every layer: sequential
    fine-tuning) or ``fixed`` (``layers`` at every context). With ``cfg.lora.replay`` > 0,
    each update also trains on that many windows of ``replay`` (generic text, [2, N, T]).
    Returns ``(running_model, records, pairs)``; ``on_commit(t, model)`` runs
    after each commit (for evaluation).
    """
    if selection not in SELECTIONS:
        raise PlasticError(f"selection must be one of {', '.join(SELECTIONS)}, not {selection!r}")
    model = float32_master(model)
    n_layers = num_layers_of(model)
    cfg.check(n_layers)
    if selection == "fixed":
        if not layers or any(not 0 <= x < n_layers for x in layers):
            raise PlasticError(f"selection 'fixed' needs layers in 0..{n_layers - 1}, "
                               f"got {layers!r}")
    grammar = LayerGrammar.for_model(model, tokenizer, n_layers, cfg.max_layers)
    gen = torch.Generator().manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    records: list[StepRecord] = []
    pairs: list[PreferencePair] = []
    for t in tqdm(range(len(contexts)), desc=desc, disable=not progress, leave=False):
        t0 = time.time()
        ctx = contexts[t]
        prompt = action_prompt(ctx.text, n_layers, cfg.prompt_chars)
        seed = cfg.seed * 100_003 + t
        windows = with_replay(context_windows(tokenizer, ctx.text, cfg.lora.max_tokens), replay,
                              cfg.lora.replay, pad_of(tokenizer), seed)
        if selection in ("all", "fixed"):
            actions = [tuple(range(n_layers)) if selection == "all" else tuple(sorted(layers))]
            completions = [[]]
        else:
            k = cfg.k if selection == "best" else 1
            temp = cfg.temperature if selection == "best" else 0.0
            sampled = sample_actions(model, tokenizer, prompt, grammar, k, temp, gen)
            actions = [a.layers for a in sampled]
            completions = [a.token_ids for a in sampled]
            if selection == "random":
                actions = [tuple(sorted(rng.sample(range(n_layers), len(actions[0]))))]
        # Identical selections would train identical adapters: adapt each distinct one once.
        distinct: dict[tuple[int, ...], list[int]] = {}
        for a, c in zip(actions, completions):
            distinct.setdefault(a, c)
        candidates = []
        if selection == "best":
            probe = RewardProbe(model, tokenizer, contexts, t, cfg)
            best = None
            if cfg.together and len(distinct) > 1:
                merged, curves = adapt_lora_together(model, list(distinct), windows, cfg.lora,
                                                     [seed + i for i in range(len(distinct))])
                trained = [(m, [c[i] for c in curves]) for i, m in enumerate(merged)]
            else:
                trained = [adapt_lora(model, layers, windows, cfg.lora, seed)
                           for layers in distinct]
            for (layers, comp), (adapted, losses) in zip(distinct.items(), trained):
                r = probe(adapted)
                candidates.append({"layers": list(layers), "reward": asdict(r),
                                   "loss_first": losses[0], "loss_last": losses[-1],
                                   "completion": comp})
                if best is None or r.total > best[1].total:
                    best = (adapted, r, layers)
            del trained
            model, reward, chosen = best
            prompt_ids = encode_with_bos(tokenizer, prompt)
            pairs += preference_pairs(prompt_ids, [c["completion"] for c in candidates],
                                      [c["reward"]["total"] for c in candidates])
        else:
            chosen = next(iter(distinct))
            model, losses = adapt_lora(model, chosen, windows, cfg.lora, seed)
            reward = None
            candidates.append({"layers": list(chosen), "loss_first": losses[0],
                               "loss_last": losses[-1]})
        for c in candidates:
            c.pop("completion", None)
        records.append(StepRecord(t, ctx.id, tuple(chosen), reward, candidates,
                                  round(time.time() - t0, 3)))
        if on_commit is not None:
            on_commit(t, model)
    return model, records, pairs


def action_stats(records: Sequence[StepRecord], num_layers: int) -> dict:
    """Histogram of committed layers and how varied the candidates were."""
    hist = Counter(i for r in records for i in r.layers)
    distinct = [len({tuple(c["layers"]) for c in r.candidates}) for r in records]
    return {"layer_histogram": [hist.get(i, 0) for i in range(num_layers)],
            "mean_layers_per_action": sum(len(r.layers) for r in records) / max(1, len(records)),
            "mean_distinct_candidates": sum(distinct) / max(1, len(distinct))}


def meta_train(policy, tokenizer, streams: Sequence[Sequence[Context]], cfg: SCoLConfig,
               out: str | Path, resume: bool = False, progress: bool = True,
               replay: torch.Tensor | None = None):
    """Meta-train theta_0 = ``policy`` over ``streams`` for ``cfg.outer_steps`` outer steps.

    Each outer step consolidates one stream (cycling) from theta_0 with best-of-K commits,
    adds the step's preference pairs to a buffer (the newest ``cfg.pair_buffer``), then
    applies IPO to theta_0 on the buffer against the reference (``cfg.ipo_reference``: the
    policy before meta-training, fixed, by default). ``out/checkpoint`` holds the latest
    theta_0, optimiser, buffer and step, ``out/reference`` the fixed reference; ``resume``
    continues from them. Metrics go to ``out/metrics.jsonl``. Returns the trained policy.
    """
    if not streams:
        raise PlasticError("meta-training needs at least one stream of contexts")
    run = RunDir(Path(out))
    ckpt, ref_dir = run.path / "checkpoint", run.path / "reference"
    policy = float32_master(policy)
    start, buffer = 0, []
    partial = ckpt.with_name(ckpt.name + ".partial")
    if resume and not (ckpt / "state.json").exists() and (partial / "state.json").exists():
        # a crash between the old checkpoint's removal and the rename: the new one is whole
        shutil.rmtree(ckpt, ignore_errors=True)
        partial.rename(ckpt)
    if resume and (ckpt / "state.json").exists():
        check_resumable(run.path / "config.json", cfg)
        run.write_json("config.json", cfg)
        policy, _ = load_causal_lm(ckpt, dtype="float32")
        policy = float32_master(policy)
        start = json.loads((ckpt / "state.json").read_text())["outer_step"]
        if (ckpt / "pairs.json").exists():
            buffer = pairs_from_json(json.loads((ckpt / "pairs.json").read_text()))
    elif resume:
        raise PlasticError(f"nothing to resume: {ckpt} holds no checkpoint (run without "
                           "--resume to start)")
    else:
        run.write_json("config.json", cfg)
    n_layers = num_layers_of(policy)
    cfg.check(n_layers)
    fixed = None
    if cfg.ipo_reference == "initial":
        if start and ref_dir.exists():
            fixed, _ = load_causal_lm(ref_dir, dtype="float32")
            fixed = float32_master(fixed)
        else:
            fixed = copy.deepcopy(policy)
            fixed.save_pretrained(ref_dir)
        fixed.eval()
        for p in fixed.parameters():
            p.requires_grad_(False)
    for p in policy.parameters():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.ipo_lr, weight_decay=0.0)
    if start and (ckpt / "optimizer.safetensors").exists():
        load_optimizer(opt, ckpt / "optimizer.safetensors")
    grammar = LayerGrammar.for_model(policy, tokenizer, n_layers, cfg.max_layers)
    reference_logps: dict = {}   # the fixed reference's log-probs of buffered pairs
    for step in tqdm(range(start, cfg.outer_steps), desc="meta-train", disable=not progress):
        t0 = time.time()
        stream = streams[step % len(streams)]
        reference = fixed
        if reference is None:
            reference = copy.deepcopy(policy).eval()
            for p in reference.parameters():
                p.requires_grad_(False)
        step_cfg = copy.deepcopy(cfg)
        step_cfg.seed = cfg.seed * 1000 + step
        _, records, pairs = consolidate_stream(copy.deepcopy(policy), tokenizer, stream,
                                               step_cfg, "best", desc=f"outer step {step}",
                                               replay=replay)
        buffer = (pairs + buffer)[: cfg.pair_buffer] if cfg.pair_buffer else pairs
        stats = ipo_update(policy, reference, buffer, opt, cfg.ipo_tau, cfg.ipo_epochs, grammar,
                           reference_logps if fixed is not None else None, cfg.diversity)
        rewards = [r.reward.total for r in records if r.reward is not None]
        run.log(outer_step=step, mean_reward=sum(rewards) / max(1, len(rewards)),
                mean_acquisition=sum(r.reward.acquisition for r in records) / len(records),
                mean_forgetting=sum(r.reward.forgetting for r in records) / len(records),
                new_pairs=len(pairs), buffered_pairs=len(buffer),
                h_target=1.0 / (2.0 * cfg.ipo_tau),
                **stats, **action_stats(records, n_layers), seconds=round(time.time() - t0, 2))
        save_checkpoint(ckpt, policy, tokenizer, opt, {"outer_step": step + 1},
                        pairs_to_json(buffer))
        if reference is not fixed:
            del reference
    return policy
