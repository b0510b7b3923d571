"""Peak memory and wall time of FedNL, 2 clients x 1 round, at the full Qwen2.5-0.5B shape.

    python bench/fednl_realshape_memory.py --dtype float32
    python bench/fednl_realshape_memory.py --dtype bfloat16
    python bench/fednl_realshape_memory.py --smoke          # the 1-layer cut, 4 items, 1 step
    PYTHONPATH=/tmp/base/src python bench/fednl_realshape_memory.py --label before ...

Runs ``plasticlm fednl run --quick`` with the model ``shape:qwen2.5-0.5b`` (random weights,
24 layers, 151,936-wide logits, the quick sandbox's tokenizer and data) as a child process and
samples, every ``--interval`` seconds, the resident memory of that process and all of its
descendants (the SuperLink, the server, Ray and the simulated clients): the sum of RSS (shared
pages counted once per process) and the sum of PSS (shared pages split between their users).
Appends one record per run to bench/results/fednl_realshape_memory.json; ``--smoke`` (the
shape cut to 1 layer, 4 training and 2 test items per client, 1 local step: Flower's start
dominates, about a minute on 2 busy cores) prints its record, writes nothing and exits with
the run's status.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

RESULTS = Path(__file__).parent / "results" / "fednl_realshape_memory.json"


class TreeSampler(threading.Thread):
    """Peak summed RSS and PSS of a process and its descendants, sampled every ``interval``."""

    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.root, self.interval = psutil.Process(pid), interval
        self.peak_rss = self.peak_pss = 0
        self.peak_procs = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                procs = [self.root] + self.root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            rss = pss = 0
            for p in procs:
                try:
                    rss += p.memory_info().rss
                    pss += p.memory_full_info().pss
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    pass
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self.peak_procs = max(self.peak_procs, len(procs))
            self.stop.wait(self.interval)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--model", default="shape:qwen2.5-0.5b")
    ap.add_argument("--smoke", action="store_true",
                    help="the 1-layer cut, tiny data, 1 local step; prints, writes nothing")
    ap.add_argument("--label", default="", help="recorded with the result (e.g. before/after)")
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra FedNLConfig overrides")
    args = ap.parse_args()
    model = "shape:qwen2.5-0.5b@1" if args.smoke else args.model
    smoke = ["data.max_train=4", "data.max_test=2", "train.local_steps=1", "train.batch_size=2",
             "eval.local_eval=last"] if args.smoke else []

    runs = tempfile.mkdtemp(prefix="fednl-realshape-")
    overrides = [f"model={model}", "data.split=dirichlet", "data.num_clients=2",
                 "train.rounds=1", "name=realshape-memory", f"outputs.out={runs}", *smoke,
                 *args.set]
    cmd = [sys.executable, "-m", "plasticlm.cli", "fednl", "run", "--quick", "--device", "cpu",
           "--dtype", args.dtype] + [a for o in overrides for a in ("--set", o)]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    sampler = TreeSampler(proc.pid, args.interval)
    sampler.start()
    output = proc.communicate()[0]
    wall = time.time() - t0
    sampler.stop.set()
    sampler.join()
    summary = Path(runs) / "realshape-memory" / "summary.json"
    record = {
        "label": args.label, "model": model, "dtype": args.dtype, "returncode": proc.returncode,
        "wall_s": round(wall, 1), "peak_rss_gb": round(sampler.peak_rss / 1e9, 2),
        "peak_pss_gb": round(sampler.peak_pss / 1e9, 2), "peak_processes": sampler.peak_procs,
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "summary": json.loads(summary.read_text()) if summary.exists() else None,
        "command": " ".join(cmd), "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if proc.returncode != 0:
        record["output_tail"] = output[-2000:]
    print(json.dumps({k: v for k, v in record.items() if k != "summary"}, indent=1))
    if args.smoke:
        shutil.rmtree(runs, ignore_errors=True)
        sys.exit(proc.returncode)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps(rows + [record], indent=1) + "\n")


if __name__ == "__main__":
    main()
