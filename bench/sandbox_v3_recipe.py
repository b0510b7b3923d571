"""One sandbox-v3 recipe experiment: pre-train one model on the world's corpus mixed with
reading documents (a :class:`plasticlm.sandbox.reading.ReadingMix` given as JSON) and probe it
every ``--every`` steps: core held-out MC and every reading probe
(:func:`plasticlm.sandbox.reading_probes.evaluate_reading`), a learning curve. The rows of
docs/sandbox.md ("Recipe experiments") were run by this script.

    python bench/sandbox_v3_recipe.py --name e4 --layers 4 --steps 1600 --every 400 \\
        --mix '{"share": 0.3, "warmup_steps": 800}'
    python bench/sandbox_v3_recipe.py --smoke   # a few steps of a tiny model, a temp folder

Writes ``--out`` (default ``bench/results/sandbox_v3_recipes/<name>.json``): the arguments,
the curve (step, wall seconds, accuracy per probe, the probes' own seconds), rewritten at
every probe, and at the end the mean loss per 50 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RESULTS = Path(__file__).resolve().parent / "results" / "sandbox_v3_recipes"


def _mix(text: str):
    from plasticlm.sandbox.reading import ReadingMix

    fields = json.loads(text)
    return ReadingMix(**{k: tuple(tuple(x) if isinstance(x, list) else x for x in v)
                         if isinstance(v, list) else v for k, v in fields.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default="recipe")
    ap.add_argument("--arch", default="qwen3")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--inter", type=int, default=384)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv", type=int, default=2)
    ap.add_argument("--hd", type=int, default=32)
    ap.add_argument("--steps", type=int, default=1600)
    ap.add_argument("--every", type=int, default=400)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0,
                    help="the model's initialisation and the batches' draws (0: the rows' own)")
    ap.add_argument("--n", type=int, default=80, help="items per reading probe")
    ap.add_argument("--mix", default="{}", help="ReadingMix fields as JSON")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)

    from plasticlm.data.niah import haystack_sentences
    from plasticlm.models import build_tiny, train_bpe_tokenizer
    from plasticlm.models.pretrain import masked_lm_loss, packed_segment_batch, train_steps
    from plasticlm.sandbox.probes import evaluate_world_mc
    from plasticlm.sandbox.reading import document_drawer
    from plasticlm.sandbox.reading_probes import evaluate_reading
    from plasticlm.sandbox.world import WorldConfig, generate_world
    from plasticlm.sandbox.world_index import write_world

    work = Path(tempfile.mkdtemp(prefix="v3-recipe-"))
    if a.smoke:
        a.layers, a.hidden, a.inter, a.hd, a.steps, a.every, a.n, a.seq = 2, 32, 64, 8, 4, 2, 8, 64
        out = work / "smoke.json"
    else:
        out = Path(a.out) if a.out else RESULTS / f"{a.name}.json"
    world = generate_world(WorldConfig(seed=0))
    world_dir = write_world(world, work / "world")
    tok = train_bpe_tokenizer(world.train_docs, vocab_size=1024)
    mix = _mix(a.mix)
    draw = document_drawer(world, mix, haystack_sentences(world.train_docs), tok)
    hay = haystack_sentences(world.valid_docs)
    model = build_tiny(a.arch, seed=a.seed, vocab_size=len(tok), hidden_size=a.hidden,
                       num_layers=a.layers, num_heads=a.heads, num_kv_heads=a.kv,
                       head_dim=a.hd, intermediate_size=a.inter, max_position_embeddings=2048)
    log: dict = {"args": vars(a), "mix": repr(mix), "curve": []}
    t0 = time.time()

    def evaluate(step: int) -> None:
        t_eval = time.time()
        model.eval()
        with torch.no_grad():
            reading = evaluate_reading(model, tok, world, hay, n=a.n)
            mc = evaluate_world_mc(model, tok, world_dir, "core")["all"]
        row = {"step": step, "wall": round(time.time() - t0), "mc": mc["accuracy"],
               **{k: v["accuracy"] for k, v in reading.items()},
               "eval_s": round(time.time() - t_eval),
               "ci95": {k: [v["low"], v["high"]] for k, v in {"mc": mc, **reading}.items()
                        if "low" in v}}
        log["curve"].append(row)
        print(json.dumps(row), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(log, indent=1) + "\n")   # a stopped run keeps its curve
        model.train()

    def loss_at(step: int) -> torch.Tensor:
        if step and step % a.every == 0:
            evaluate(step)
        # train_lm_segments' draw (seed 0: the step itself, as every row before r7 drew)
        rng = random.Random(a.seed * max(7919, a.steps) + step)
        return masked_lm_loss(model, *packed_segment_batch(tok, lambda r: draw(r, step),
                                                           a.batch, a.seq, rng))

    losses = train_steps(model, loss_at, a.steps, lr=a.lr, warmup=min(100, a.steps // 10 + 1),
                         progress=False)
    evaluate(a.steps)
    log["loss_every_50"] = [round(sum(losses[i:i + 50]) / len(losses[i:i + 50]), 3)
                            for i in range(0, len(losses), 50)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(log, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
