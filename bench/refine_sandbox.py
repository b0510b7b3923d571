"""FedRefine on the sandbox: every mode's accuracy, time to first token, latency and bytes.

    python bench/refine_sandbox.py [--quick] [key=value ...]

Trains the fusers (specialist, transmitter-llama, transmitter-qwen2 -> receiver; a private
prefix fuser; the reverse fuser for co-c2c) on the specialist questions of dev+val and
evaluates on the test split. Writes report.json, table.md, PNGs into bench/results/.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tiny ops on a shared CPU: one intra-op thread avoids spin-waiting between workers.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from plasticlm.config import load_config  # noqa: E402
from plasticlm.refine.experiment import ExperimentConfig, run_experiment  # noqa: E402
from plasticlm.refine.report import markdown_table  # noqa: E402


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    overrides = [a for a in argv if a != "--quick"]
    out = Path(__file__).resolve().parent / "results" / ("refine_quick" if quick else
                                                         "refine_sandbox")
    base = [f"out={out}"]
    if quick:
        base += ["receiver=quick:receiver", 'transmitters=["quick:specialist", '
                 '"quick:transmitter-llama"]', "fuser.epochs=1", "max_eval=4", "max_train=8"]
    cfg = load_config(ExperimentConfig, None, base + overrides)
    report = run_experiment(cfg)
    print(markdown_table(report))
    print(f"seconds: {report['seconds']}; folder: {cfg.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
