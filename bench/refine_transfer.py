"""Do sandbox fusers carry knowledge they were not trained on? A controlled test.

    python bench/refine_transfer.py [--epochs 10] [--out bench/results/refine_transfer.json]
    python bench/refine_transfer.py --smoke   # the quick sandbox, 1 epoch, a few questions

The specialist read Q/A lines about its `dev` entities, so it knows those facts best. Their
questions are split in two folds by entity. For each fold, fusers are trained on the other
fold's questions plus the `val` and `test` questions, and scored on the held-out fold,
whose entities no fuser saw. Two transmitters: the specialist, and a control that never
read these facts (transmitter-llama, the specialist's tokenizer); three fusions: `aligned`,
`prefix` with 2 draft tokens, and `prefix` sharing only 3 drafted tokens (`share="draft"`). Knowledge transfers only if the specialist's
fuser beats the control's on held-out entities; beating the receiver alone is not enough
(a fuser can shift the receiver toward answers frequent in training through any cache).
The training questions' own accuracy shows memorisation. Writes a JSON report.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tiny ops on a shared CPU: one intra-op thread avoids spin-waiting between workers.
os.environ.setdefault("OMP_NUM_THREADS", "1")

RESULTS = Path(__file__).resolve().parent / "results"
FUSIONS = {"aligned": {"mode": "aligned"},
           "prefix+draft": {"mode": "prefix", "draft_tokens": 2},
           "draft-only": {"mode": "prefix", "draft_tokens": 3, "share": "draft"}}


def main() -> None:
    from plasticlm.data.mmlu import load_mmlu
    from plasticlm.refine import FedRefine, Link
    from plasticlm.refine.examples import make_examples
    from plasticlm.refine.fusers.train import FuserTrainConfig, train_fuser
    from plasticlm.refine.peer import load_peer
    from plasticlm.sandbox import sandbox_world
    from plasticlm.sandbox.passages import mc_prompt
    from plasticlm.sandbox.world_index import question_meta, read_world_index

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--control", default="transmitter-llama")
    ap.add_argument("--out", default=str(RESULTS / "refine_transfer.json"))
    ap.add_argument("--smoke", action="store_true", help="the quick sandbox, 1 epoch, 4 "
                    "training and 2 held-out questions per fold, written to a temp folder")
    args = ap.parse_args()
    preset, train_cap, test_cap = "sandbox", None, None
    if args.smoke:
        preset, train_cap, test_cap, args.epochs = "quick", 4, 2, 1
        args.out = str(Path(tempfile.mkdtemp(prefix="bench-smoke-")) / "refine_transfer.json")

    world = sandbox_world(preset)
    folder = world / "specialist_mmlu"
    meta = question_meta(read_world_index(world), "specialist")

    def entity(q) -> str:
        return meta[(q.subject, q.split, q.index)]["fact"].rsplit(".", 1)[0]

    dev = load_mmlu(folder, "dev")
    rest = load_mmlu(folder, "val") + load_mmlu(folder, "test")
    entities = sorted({entity(q) for q in dev})
    folds = [set(entities[0::2]), set(entities[1::2])]
    receiver = load_peer(f"{preset}:receiver")
    peers = {"specialist": load_peer(f"{preset}:specialist"),
             "control": load_peer(f"{preset}:{args.control}")}

    def accuracy(fr, mode, qs) -> list[bool]:
        return [fr.score(mc_prompt(q.question), list(q.choices), mode).choice == q.answer_index
                for q in qs]

    t0 = time.time()
    hits: dict[str, list[bool]] = {}
    for k, held in enumerate(folds):
        test = [q for q in dev if entity(q) in held][:test_cap]
        train = ([q for q in dev if entity(q) not in held] + rest)[:train_cap]
        examples = make_examples(train, mc_prompt)
        hits.setdefault("receiver alone", []).extend(
            accuracy(FedRefine(receiver), "alone", test))
        hits.setdefault("specialist alone", []).extend(
            accuracy(FedRefine(peers["specialist"]), "alone", test))
        for who, peer in peers.items():
            for fusion, kw in FUSIONS.items():
                cfg = FuserTrainConfig(epochs=args.epochs, **kw)
                fuser, _ = train_fuser(receiver, peer, examples, cfg, progress=False)
                fr = FedRefine(receiver, [Link(peer, fuser)])
                hits.setdefault(f"c2c {fusion} via {who}", []).extend(
                    accuracy(fr, "c2c", test))
                hits.setdefault(f"c2c {fusion} via {who}, training questions", []).extend(
                    accuracy(fr, "c2c", train))
                print(f"fold {k} {who} {fusion}: done ({time.time() - t0:.0f} s)", flush=True)
    rows = {k: {"accuracy": sum(v) / len(v), "n": len(v)} for k, v in hits.items()}
    report = {"epochs": args.epochs, "control": args.control, "folds": 2,
              "held_out_entities": len(entities), "rows": rows,
              "seconds": round(time.time() - t0, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print("| row | accuracy | n |\n|---|---|---|")
    for k, v in rows.items():
        print(f"| {k} | {100 * v['accuracy']:.1f}% | {v['n']} |")
    print(f"wrote {args.out} ({report['seconds']} s)")


if __name__ == "__main__":
    main()
