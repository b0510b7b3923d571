"""SCoL's outer loop: IPO on the policy theta_0 over meta-training streams.

Each outer step consolidates one stream from theta_0 with best-of-K commits (the inner loop,
:func:`plasticlm.scol.stream.consolidate_stream`), whose candidate pairs with different
rewards become IPO preference pairs; IPO then updates theta_0 against its reference.
"""


from __future__ import annotations

import copy
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from plasticlm.errors import PlasticError
from plasticlm.models import load_causal_lm
from plasticlm.run_lock import RunLock, refuse_if_locked
from plasticlm.runs import RunDir
from plasticlm.scol.checkpoint import check_resumable, load_optimizer, save_checkpoint
from plasticlm.scol.config import SCoLConfig
from plasticlm.scol.consolidate import float32_master, num_layers_of
from plasticlm.scol.ipo import ipo_update, pairs_from_json, pairs_to_json
from plasticlm.scol.policy import LayerGrammar
from plasticlm.scol.records import Context
from plasticlm.scol.stream import StepRecord, action_stats, consolidate_stream

# the inner loop's names, where callers have always found them
__all__ = ["SCoLConfig", "StepRecord", "action_stats", "consolidate_stream", "meta_train"]


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
    refuse_if_locked(out)
    run = RunDir(Path(out))
    with RunLock(run.path):   # one writer: a second run or resume is refused, naming this one
        return _meta_train(run, policy, tokenizer, streams, cfg, resume, progress, replay)


def _meta_train(run: RunDir, policy, tokenizer, streams, cfg: SCoLConfig, resume: bool,
                progress: bool, replay: torch.Tensor | None):
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
        step_cfg = replace(cfg, seed=cfg.seed * 1000 + step)
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
