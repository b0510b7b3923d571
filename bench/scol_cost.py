"""Wall time per context: SCoL with K candidates vs one sequential fine-tuning update.

    python bench/scol_cost.py --model ~/.cache/plasticlm/scol/receiver \
        --squad ~/.cache/plasticlm/models/sandbox/world/squad/unseen.json --contexts 4 --k 4

Writes bench/results/scol_cost.json and scol_cost.png. Default model/data: the sandbox
receiver and world (trained on first use). ``--smoke``: the quick preset's receiver and world,
1 context, K = 2, 1 LoRA step, written to a temp folder.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="")
    ap.add_argument("--squad", default="")
    ap.add_argument("--contexts", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--smoke", action="store_true", help="the quick preset, 1 context, K = 2, "
                    "1 LoRA step, written to a temp folder (a quick check)")
    args = ap.parse_args()
    preset = "sandbox"
    if args.smoke:
        preset, args.contexts, args.k, args.steps = "quick", 1, 2, 1
        args.out = tempfile.mkdtemp(prefix="bench-smoke-")

    from plasticlm.data.squad import load_squad
    from plasticlm.experiments.scol.setup import ExperimentConfig, load_model, resolve_world_file
    from plasticlm.scol.contexts import contexts_from_passages, split_streams
    from plasticlm.scol.meta import consolidate_stream

    cfg = ExperimentConfig(model=args.model, preset=preset, squad=args.squad,
                           threads=args.threads)
    # explore (temperature 2), so that K distinct candidates are really trained
    cfg = dataclasses.replace(cfg, scol=dataclasses.replace(
        cfg.scol, k=args.k, temperature=2.0,
        lora=dataclasses.replace(cfg.scol.lora, steps=args.steps)))
    model, tok = load_model(cfg)
    contexts = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")))
    _, stream = split_streams(contexts, 0, 0, args.contexts, seed=1)
    rows = {}
    for name, selection, reward, together in (
            ("sequential_ft", "all", "supervised", False),
            ("scol_greedy", "greedy", "supervised", False),
            ("scol_best_of_k_intrinsic_one_by_one", "best", "intrinsic", False),
            ("scol_best_of_k_intrinsic_together", "best", "intrinsic", True),
            ("scol_best_of_k_supervised_together", "best", "supervised", True)):
        c = dataclasses.replace(cfg.scol, reward=reward, together=together)
        t = time.time()
        _, records, pairs = consolidate_stream(copy.deepcopy(model), tok, stream, c, selection)
        total = time.time() - t
        rows[name] = {"seconds_per_context": total / len(stream),
                      "candidates_per_context": sum(len(r.candidates) for r in records)
                      / len(records), "pairs": len(pairs)}
        print(name, json.dumps(rows[name]))
    # Same K layer sets, same contexts: PEFT one candidate at a time vs all in one batch.
    from plasticlm.scol.candidates import adapt_lora_together
    from plasticlm.scol.consolidate import adapt_lora, context_windows, num_layers_of

    n = num_layers_of(model)
    sets = [tuple(sorted({i % n, (i * 3 + 1) % n})) for i in range(args.k)]
    timing = {"peft_one_by_one": 0.0, "together": 0.0}
    for ctx in stream:
        w = context_windows(tok, ctx.text, cfg.scol.lora.max_tokens)
        t = time.time()
        for s in sets:
            adapt_lora(model, s, w, cfg.scol.lora)
        timing["peft_one_by_one"] += time.time() - t
        t = time.time()
        adapt_lora_together(model, sets, w, cfg.scol.lora)
        timing["together"] += time.time() - t
    for name, v in timing.items():
        rows[f"train_{args.k}_candidates_{name}"] = {"seconds_per_context": v / len(stream),
                                                     "candidates_per_context": args.k}
        print(name, v / len(stream))
    base = rows["sequential_ft"]["seconds_per_context"]
    for r in rows.values():
        r["x_sequential_ft"] = r["seconds_per_context"] / base
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"model": str(cfg.model or "sandbox receiver"), "contexts": len(stream),
              "k": args.k, "lora_steps": args.steps, "threads": args.threads,
              "load_average": os.getloadavg()[0], "rows": rows}
    (out / "scol_cost.json").write_text(json.dumps(result, indent=1) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(list(rows), [r["seconds_per_context"] for r in rows.values()])
    ax.set_xlabel("wall seconds per context")
    ax.set_title(f"SCoL cost, K={args.k}, {args.steps} LoRA steps", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "scol_cost.png", dpi=100)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
