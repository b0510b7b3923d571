"""C2C accuracy on the fusers' own training questions vs the receiver alone (sandbox).

    OMP_NUM_THREADS=1 python bench/refine_train_facts.py bench/results/refine_sandbox_dev_e10

Reads the fusers a ``refine_sandbox.py`` run saved (trained on the dev split), scores the dev
questions with the specialist's fuser and with transmitter-llama's (a transmitter that does
not know these facts: the control for memorisation) and writes
bench/results/refine_train_facts.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from plasticlm.refine import FedRefine, Fuser, Link  # noqa: E402
from plasticlm.refine.experiment import ExperimentConfig, load_peer, load_questions  # noqa: E402


def main(run: str) -> dict:
    train, _, prompt = load_questions(ExperimentConfig(train_splits=("dev",),
                                                       eval_splits=("val",)))
    receiver = load_peer("sandbox:receiver")
    out: dict = {"run": run, "n": len(train)}
    for name in ("specialist", "transmitter-llama"):
        peer = load_peer(f"sandbox:{name}")
        fuser = Fuser.from_pretrained(Path(run) / "fusers" / f"{name}-to-receiver")
        fr = FedRefine(receiver, [Link(peer, fuser)])
        for mode in ("alone", "c2c"):
            hits = sum(fr.score(prompt(q.question), list(q.choices), mode).choice == q.answer_index
                       for q in train)
            out[f"{name}/{mode}"] = hits / len(train)
    path = Path(__file__).resolve().parent / "results" / "refine_train_facts.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/refine_sandbox_dev_e10")
