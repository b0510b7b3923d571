"""``plasticlm scol experiment sweep``: calibrate the inner update before any policy is trained.

Every setting of a grid (target modules x steps x learning rate x rank, with and without
generic replay) consolidates the same evaluation stream, one commit per context, each on
random layers of the sizes a policy names (1 to ``max_layers``, drawn by seed, identical for
every setting). Measured per setting: acquisition (EM on a context's questions right after
its commit, the diagonal), retention (EM on every earlier context after the whole stream)
and the legal-answer rate after the whole stream, beside the untouched model's. The
recommended default is the setting with the best acquisition among those that keep the
legal-answer rate at >= ``keep_legal`` of the untouched model's.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tqdm.auto import tqdm

from plasticlm.scol.consolidate import (
    LoraTrainConfig,
    adapt_lora,
    context_windows,
    num_layers_of,
    pad_of,
    with_replay,
)
from plasticlm.scol.contexts import contexts_from_passages, split_streams
from plasticlm.scol.experiment import (
    AccuracyMatrix,
    legal_sets,
    load_model,
    replay_pool,
    resolve_world_file,
)
from plasticlm.scol.rewards import qa_accuracy

MODULES = {"attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
           "mlp": ("gate_proj", "up_proj", "down_proj"),
           "all": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}


@dataclass
class SweepConfig:
    """The grid; every combination runs."""

    modules: tuple[str, ...] = ("attention", "mlp", "all")
    steps: tuple[int, ...] = (4, 12)
    lr: tuple[float, ...] = (1e-3, 3e-3)
    rank: tuple[int, ...] = (8,)
    replay: tuple[int, ...] = (0, 4)
    max_layers: int = 2
    keep_legal: float = 0.9      # a setting must keep this share of the untouched legal rate
    seed: int = 0

    def settings(self) -> list[dict]:
        return [{"modules": m, "steps": s, "lr": lr, "rank": r, "replay": rp}
                for m, s, lr, r, rp in itertools.product(self.modules, self.steps, self.lr,
                                                        self.rank, self.replay)]


@dataclass
class SweepResult:
    setting: dict
    immediate: float
    retention: float
    legal_final: float
    seconds: float
    layers: list[list[int]] = field(default_factory=list)


def lora_config(base: LoraTrainConfig, setting: dict) -> LoraTrainConfig:
    """``base`` with one grid setting applied."""
    return replace(base, target_modules=MODULES[setting["modules"]], steps=setting["steps"],
                   lr=setting["lr"], rank=setting["rank"], alpha=2.0 * setting["rank"],
                   replay=setting["replay"])


def run_setting(base_model, tokenizer, stream, lora: LoraTrainConfig, layer_sets, replay,
                seed: int = 0) -> SweepResult:
    """Consolidate ``stream`` with ``lora`` on ``layer_sets`` (one per context)."""
    t0 = time.time()
    model = copy.deepcopy(base_model)
    immediate = 0.0
    for t, (ctx, layers) in enumerate(zip(stream, layer_sets)):
        windows = with_replay(context_windows(tokenizer, ctx.text, lora.max_tokens), replay,
                              lora.replay, pad_of(tokenizer), seed * 100_003 + t)
        model, _ = adapt_lora(model, layers, windows, lora, seed * 100_003 + t)
        immediate += qa_accuracy(model, tokenizer, ctx.questions, "em") / len(stream)
    final = AccuracyMatrix(stream)
    final.add_row(model, tokenizer, len(stream) - 1)
    last = final.em[-1][:-1]
    return SweepResult({}, immediate, sum(last) / max(1, len(last)), final.legal[-1] or 0.0,
                       round(time.time() - t0, 1), [list(x) for x in layer_sets])


def run_sweep(cfg, sweep: SweepConfig, out: str | Path, progress: bool = True) -> dict:
    """The sweep on ``cfg``'s model and evaluation stream (a
    :class:`plasticlm.scol.experiment.ExperimentConfig`); writes ``sweep.json`` and
    ``sweep.md`` under ``out`` and returns the report."""
    from plasticlm.data.squad import load_squad

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base, tok = load_model(cfg)
    contexts = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")),
                                      legal_sets(cfg))
    _, stream = split_streams(contexts, cfg.train_streams, cfg.stream_length, cfg.eval_length,
                              cfg.seed)
    n = num_layers_of(base)
    rng = random.Random(sweep.seed)
    layer_sets = [tuple(sorted(rng.sample(range(n), rng.randint(1, sweep.max_layers))))
                  for _ in stream]
    untouched = AccuracyMatrix(stream)
    untouched.add_row(base, tok, len(stream) - 1)
    base_legal = untouched.legal[-1] or 0.0
    with_pool = copy.deepcopy(cfg)
    with_pool.scol.lora.replay = max(sweep.replay)
    pool = replay_pool(with_pool, tok)
    results = []
    for setting in tqdm(sweep.settings(), desc="inner-update sweep", disable=not progress):
        r = run_setting(base, tok, stream, lora_config(cfg.scol.lora, setting), layer_sets,
                        pool, sweep.seed)
        r.setting = setting
        results.append(r)
        if progress:
            print(f"[sweep] {setting}: immediate {100 * r.immediate:.1f}%, retention "
                  f"{100 * r.retention:.1f}%, legal {100 * r.legal_final:.0f}% "
                  f"(untouched {100 * base_legal:.0f}%)", flush=True)
    ok = [r for r in results if r.legal_final >= sweep.keep_legal * base_legal]
    best = max(ok, key=lambda r: (r.immediate, r.retention)) if ok else None
    report = {"sweep": asdict(sweep), "contexts": len(stream), "layer_sets": layer_sets,
              "untouched": {"legal": base_legal, "em": untouched.summary()["em"]["final_all"]},
              "results": [asdict(r) for r in results],
              "recommended": best.setting if best else None}
    (out / "sweep.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "sweep.md").write_text(sweep_markdown(report))
    return report


def sweep_markdown(report: dict) -> str:
    """The sweep as a table, the kept settings marked, the recommended one named."""
    keep = report["sweep"]["keep_legal"] * report["untouched"]["legal"]
    lines = [f"Inner-update sweep on {report['contexts']} evaluation contexts (random layers of "
             f"1..{report['sweep']['max_layers']} per context, the same for every setting). "
             f"Untouched model: legal answers {100 * report['untouched']['legal']:.0f}%, "
             f"EM {100 * (report['untouched']['em'] or 0):.1f}%.", "",
             "| modules | steps | lr | rank | replay | immediate EM | retention EM | "
             "legal answers after the stream | kept |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        s = r["setting"]
        lines.append(f"| {s['modules']} | {s['steps']} | {s['lr']:g} | {s['rank']} | "
                     f"{s['replay']} | {100 * r['immediate']:.1f}% | {100 * r['retention']:.1f}% "
                     f"| {100 * r['legal_final']:.0f}% | "
                     f"{'yes' if r['legal_final'] >= keep else 'no'} |")
    rec = report["recommended"]
    lines += ["", f"Recommended (best immediate EM among settings that keep >= "
              f"{100 * report['sweep']['keep_legal']:.0f}% of the untouched legal rate): "
              + (json.dumps(rec) if rec else "none: every setting damages the model")]
    return "\n".join(lines) + "\n"
