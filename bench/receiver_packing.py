"""Receiver pre-training batches (fixed blocks vs packed afresh) and drill budgets, for the
sandbox receiver, in one run.

The preset pre-trains the receiver on random blocks of one fixed packing of the world corpus
(about 79K tokens, seen 12 times in its 480 steps), then gives it 200 needle-drill steps of 16
samples. *Repacked* packs every step's batch afresh (documents drawn from ``(seed, step)``)
and shuffles the statements of each biography (:func:`plasticlm.sandbox.shuffle_statements`),
at the same steps, batch, rate and model. An arm is ``BATCHES:STEPSxBATCH``: the pre-training
batches, then that many drill steps of that many samples (e.g. ``repacked:400x16``). Each
kind of pre-training runs once per seed; every arm that shares it drills its own copy. Each
arm is probed on the held-out world MC questions (the val + test questions of core entities,
whose Q/A form never appeared in training; chance 25%) before and after its drills and on
needle retrieval by 4-way choice after them (chance 25%; the greedy answer's score is not
measured here); per seed, over seeds (mean and t-interval), and paired with the first arm
over the same questions and needles: pooled over seeds, and the t-interval of the seeds'
differences. ``--from-json`` renders a saved result's tables again without training.

    python bench/receiver_packing.py [--seeds 0 1 2] [--arms fixed:200x16 repacked:200x16]
    python bench/receiver_packing.py --smoke   # the quick preset, 1 seed, 2 steps; a temp folder
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RESULTS = Path(__file__).resolve().parent / "results"
BATCHES = {"fixed": "fixed blocks (preset)", "repacked": "repacked, statements shuffled"}


@dataclass(frozen=True)
class Arm:
    batches: str        # a key of BATCHES
    drill_steps: int
    drill_batch: int

    @classmethod
    def parse(cls, text: str) -> Arm:
        try:
            batches, drills = text.split(":")
            steps, batch = drills.split("x")
            arm = cls(batches, int(steps), int(batch))
        except ValueError:
            raise SystemExit(f"arm {text!r}: expected BATCHES:STEPSxBATCH, e.g. repacked:400x16") from None
        if batches not in BATCHES:
            raise SystemExit(f"arm {text!r}: batches must be one of {sorted(BATCHES)}")
        if arm.drill_steps < 0 or arm.drill_batch < 1:
            raise SystemExit(f"arm {text!r}: drill steps must be >= 0 and the batch >= 1")
        return arm

    @property
    def label(self) -> str:
        return f"{BATCHES[self.batches]}, {self.drill_steps} drills x {self.drill_batch}"


def main() -> None:
    from plasticlm.data.niah import generate_niah, haystack_sentences
    from plasticlm.models import pack_corpus, train_bpe_tokenizer, train_lm, train_lm_repacked
    from plasticlm.runtime import machine, seed_everything
    from plasticlm.sandbox import PRESETS, shuffle_statements, train_drills, world_mc_items
    from plasticlm.sandbox.pretrain import build_model
    from plasticlm.sandbox.probes import niah_choice
    from plasticlm.sandbox.world import generate_world
    from plasticlm.sandbox.world_index import write_world

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=["fixed:200x16", "repacked:200x16"],
                    help="BATCHES:STEPSxBATCH; the first is the control the others pair with")
    ap.add_argument("--steps", type=int, default=None, help="pre-training steps (preset's)")
    ap.add_argument("--out", default=str(RESULTS / "receiver_packing.json"))
    ap.add_argument("--from-json", metavar="FILE",
                    help="train nothing: render the tables of a saved result again, "
                         "rewriting FILE's table and its .md (--out is ignored)")
    ap.add_argument("--smoke", action="store_true", help="the quick preset's receiver, seed 0, "
                    "2 pre-training steps, arms fixed:2x2 repacked:2x2, written to a temp folder")
    args = ap.parse_args()
    runs_dir = Path("runs")
    if args.smoke:
        args.seeds, args.arms, args.steps = [0], ["fixed:2x2", "repacked:2x2"], 2
        runs_dir = Path(tempfile.mkdtemp(prefix="bench-smoke-"))
        args.out, args.from_json = str(runs_dir / "receiver_packing.json"), None
    if args.from_json:
        _write(json.loads(Path(args.from_json).read_text()), Path(args.from_json))
        return
    arms = [Arm.parse(a) for a in args.arms]
    if len(set(arms)) < len(arms):
        raise SystemExit(f"--arms {' '.join(args.arms)}: an arm is given twice")
    if args.steps is not None and args.steps < 1:
        raise SystemExit(f"--steps {args.steps}: give at least 1 pre-training step")

    p = PRESETS["quick" if args.smoke else "sandbox"]
    spec = next(m for m in p.models if m.name == "receiver")
    steps = spec.steps if args.steps is None else args.steps
    tspec = next(t for t in p.tokenizers if t.name == spec.tokenizer)
    world = generate_world(p.world)
    world_dir = write_world(world, runs_dir / "receiver_packing_world")
    tok = train_bpe_tokenizer(world.train_docs, vocab_size=tspec.vocab_size)
    blocks = pack_corpus(tok, world.train_docs, p.seq_len)
    drill_hay = haystack_sentences(world.train_docs)
    eval_hay = haystack_sentences(world.valid_docs)
    needles = {f"{task}/{length}": generate_niah(task, p.niah_samples, length, eval_hay,
                                                  tokenizer=tok)
               for task, length in p.niah}
    warmup = min(50, steps // 5 + 1)

    def pretrain(batches: str, seed: int):
        seed_everything(seed)
        model = build_model(replace(spec, seed=seed), len(tok), max(2048, 4 * p.seq_len))
        common = dict(steps=steps, batch_size=spec.batch_size, lr=spec.lr, warmup=warmup,
                      seed=seed, desc=f"{batches}, seed {seed}")
        if batches == "fixed":
            train_lm(model, blocks, **common)
        else:
            train_lm_repacked(model, tok, world.train_docs, seq_len=p.seq_len,
                              augment=shuffle_statements, **common)
        return model

    runs: dict[Arm, list[dict]] = {arm: [] for arm in arms}
    for seed in args.seeds:
        for batches in dict.fromkeys(a.batches for a in arms):
            t = time.time()
            base = pretrain(batches, seed)
            pretrain_seconds = round(time.time() - t, 1)
            before = _columns(world_mc_items(base, tok, world_dir))
            for arm in (a for a in arms if a.batches == batches):
                model = copy.deepcopy(base)
                t = time.time()
                losses = (train_drills(model, tok, drill_hay, arm.drill_steps, p.drill_lengths,
                                       arm.drill_batch, p.drill_lr, seed=seed)
                          if arm.drill_steps else [])
                row = {"seed": seed, "pretrain_seconds": pretrain_seconds,
                       "drill_seconds": round(time.time() - t, 1),
                       "drill_loss_every_10": [round(x, 4) for x in losses[::10]],
                       "before_drills": before,
                       "after_drills": _columns(world_mc_items(model, tok, world_dir)),
                       "needle_choice": {k: niah_choice(model, tok, s)
                                         for k, s in needles.items()}}
                runs[arm].append(row)
                print(f"seed {seed} {arm.label}: held-out MC "
                      f"{100 * _mean(before['correct']):.1f}% before drills, "
                      f"{100 * _mean(row['after_drills']['correct']):.1f}% after; needle "
                      "choice " + ", ".join(f"{100 * _mean(v):.1f}"
                                            for v in row["needle_choice"].values()),
                      flush=True)

    result = {"steps": steps, "arms": args.arms, "seeds": args.seeds,
              "receiver": _receiver(spec, p.seq_len), "machine": machine(),
              "torch_threads": torch.get_num_threads(),
              "runs": {arm.label: rows for arm, rows in runs.items()}}
    _write(result, Path(args.out))


def render(result: dict) -> str:
    """The Markdown tables of a result: each arm's means over seeds, then each arm minus the
    first, paired over the same questions and needles (pooled over seeds, and over seeds)."""
    from plasticlm.eval import format_ci, format_paired, paired_intervals, seed_ci
    from plasticlm.sandbox import PRESETS

    if "arms" not in result or "needle_choice" not in next(iter(result["runs"].values()))[0]:
        raise SystemExit("this result predates --arms and per-needle records; it cannot be "
                         "rendered again (its table is in its .md)")
    p = PRESETS["sandbox"]
    spec = next(m for m in p.models if m.name == "receiver")
    # Results written before the receiver was recorded were made with the preset's.
    model = result.get("receiver") or _receiver(spec, p.seq_len)
    arms = [Arm.parse(a) for a in result["arms"]]
    runs = [result["runs"][a.label] for a in arms]
    needles = list(runs[0][0]["needle_choice"])
    for arm, rows in zip(arms, runs):
        if ([r["seed"] for r in rows] != [r["seed"] for r in runs[0]]
                or any(r["after_drills"]["entity"] != c["after_drills"]["entity"]
                       for r, c in zip(rows, runs[0]))):
            raise SystemExit(f"arm {arm.label!r} does not pair with {arms[0].label!r}: "
                             "its seeds or questions differ")

    def mc(stage: str):
        return lambda r: r[stage]["correct"]

    def entities(stage: str):
        return lambda r: [(r["seed"], e) for e in r[stage]["entity"]]

    def needle(k: str):
        return lambda r: r["needle_choice"][k]

    def over_seeds(rows: list[dict], column) -> str:
        return format_ci(seed_ci([column(r) for r in rows]))

    def paired(rows: list[dict], column, groups=None) -> str:
        control = runs[0]
        return format_paired(*paired_intervals([column(r) for r in rows],
                                               [column(c) for c in control],
                                               groups and [groups(r) for r in rows]))

    n_mc = len(runs[0][0]["after_drills"]["correct"])
    n_needles = len(runs[0][0]["needle_choice"][needles[0]])
    lines = [f"Receiver ({model['layers']} x {model['hidden']} {model['arch']}, "
             f"{result['steps']} steps of {model['batch_size']} x {model['seq_len']} tokens, "
             "then drills), seeds "
             f"{result['seeds']}; mean over seeds [95% t-interval], n = {n_mc} questions and "
             f"{n_needles} needles per probe and seed (the same ones in every seed):", "",
             "| pre-training batches, drills | held-out MC before drills | after drills | "
             "needle choice " + " / ".join(needles) + " | pre-train s | drill s |",
             "|---|---|---|---|---|---|"]
    for arm, rows in zip(arms, runs):
        secs = [sum(r[k] for r in rows) / len(rows) for k in ("pretrain_seconds", "drill_seconds")]
        lines.append(f"| {arm.label} | {over_seeds(rows, mc('before_drills'))} | "
                     f"{over_seeds(rows, mc('after_drills'))} | "
                     + " / ".join(over_seeds(rows, needle(k)) for k in needles)
                     + f" | {secs[0]:.0f} | {secs[1]:.0f} |")
    if len(arms) == 1:
        return "\n".join(lines)
    lines += ["", f"Minus {arms[0].label}, paired over the same questions and needles, in pp: "
              "the mean, its interval pooled over seeds (entities resampled) and, in brackets, "
              "the t-interval of the seeds' differences, which is the one for a claim about "
              "the training recipe:", "",
              "| arm | held-out MC before drills | after drills | needle choice "
              + " / ".join(needles) + " |", "|---|---|---|---|"]
    for arm, rows in zip(arms[1:], runs[1:]):
        before = ("same model" if arm.batches == arms[0].batches
                  else paired(rows, mc("before_drills"), entities("before_drills")))
        lines.append(f"| {arm.label} | {before} | "
                     f"{paired(rows, mc('after_drills'), entities('after_drills'))} | "
                     + " / ".join(paired(rows, needle(k)) for k in needles) + " |")
    return "\n".join(lines)


def _write(result: dict, out: Path) -> None:
    result["table"] = render(result)
    print("\n" + result["table"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(result["table"] + "\n")


def _columns(items: list[dict]) -> dict:
    """Per-question records as columns (correct, entity)."""
    return {"correct": [it["correct"] for it in items], "entity": [it["entity"] for it in items]}


def _receiver(spec, seq_len: int) -> dict:
    return {"layers": spec.num_layers, "hidden": spec.hidden_size, "arch": spec.arch,
            "batch_size": spec.batch_size, "seq_len": seq_len}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


if __name__ == "__main__":
    main()
