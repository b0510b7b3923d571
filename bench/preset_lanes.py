"""Could the sandbox preset finish sooner on 2 cores by training two models at once?

The preset trains its models one after another, each with 2 torch threads (the peer). On 2
cores two models could instead train side by side with 1 thread each, a *lane* each. This
bench measures, for each model's training step (the receiver's pre-training and drill
batches, the Llama shape of the Llama transmitter and the specialist, the Qwen2 transmitter),
the seconds per step at 2 threads, at 1 thread alone, and at 1 thread beside another 1-thread
training (the receiver's beside the Llama's, both at once). From those ratios and a preset
report's stage times it estimates, for the machine of that report:

- the floor: every stage at 1 thread (where the cores do the most work per second), split
  perfectly over the two cores, without interference: no schedule of this family is faster;
- two lanes: the receiver (pre-training, drills, probes) in one, the transmitters and the
  specialist in the other, both at 1 thread beside each other; the receiver's lane takes 2
  threads when the other ends.

Steps use random tokens of the preset's shapes; step time does not depend on the values.

    python bench/preset_lanes.py [--seconds 20] [--report FILE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RESULTS = Path(__file__).resolve().parent / "results"
REPORTS = [RESULTS / "sandbox_v2_fresh_machine_report.json",
           RESULTS / "sandbox_v2_third_machine_report.json"]
# One training step per stage kind: (model spec, batch, tokens per row + 1).
SHAPES = {"receiver": ("receiver", 8, 257),
          "receiver-drill": ("receiver", 16, 209),   # drills: 16 rows of 142-282 tokens
          "llama": ("transmitter-llama", 8, 257),
          "qwen2": ("transmitter-qwen2", 8, 257)}
WARMUP = 3


def step_seconds(shape: str, threads: int, seconds: float) -> dict:
    """Mean seconds per AdamW step of ``shape`` at ``threads`` threads, over ``seconds``."""
    import torch

    from plasticlm.models.pretrain import lm_loss
    from plasticlm.sandbox import get_preset
    from plasticlm.sandbox.pretrain import build_model

    torch.set_num_threads(threads)
    name, batch, width = SHAPES[shape]
    spec = next(m for m in get_preset("sandbox").models if m.name == name)
    vocab = {"bpe1024": 1024, "bpe768": 768}[spec.tokenizer]
    model = build_model(spec, vocab, 2048)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(vocab, (batch, width), generator=torch.Generator().manual_seed(0))
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < WARMUP + 3 or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        lm_loss(model, x).backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t)
    kept = times[WARMUP:]
    return {"shape": shape, "threads": threads, "steps": len(kept),
            "seconds_per_step": sum(kept) / len(kept)}


def _workers(jobs: list[tuple[str, int]], seconds: float) -> list[dict]:
    """Run ``(shape, threads)`` jobs at once, each in its own process."""
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", shape, str(threads),
                               str(seconds)], stdout=subprocess.PIPE, text=True)
             for shape, threads in jobs]
    out = []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"a worker failed (exit {p.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def measure(seconds: float, repeats: int) -> dict:
    """Median seconds per step of every shape alone (1 and 2 threads) and of the receiver's
    shapes and the Llama's side by side (1 thread each), over ``repeats`` rounds that visit
    every condition once, so that a drift of the machine's speed spreads over all of them."""
    runs: dict[str, list[float]] = {}
    for r in range(repeats):
        for shape in SHAPES:
            for threads in (2, 1):
                runs.setdefault(f"{shape}@{threads}", []).append(
                    _workers([(shape, threads)], seconds)[0]["seconds_per_step"])
        for pair in (("receiver", "llama"), ("receiver-drill", "llama")):
            for s, row in zip(pair, _workers([(s, 1) for s in pair], seconds)):
                other = pair[1] if s == pair[0] else pair[0]
                runs.setdefault(f"{s}@1 beside {other}", []).append(row["seconds_per_step"])
        print(f"round {r + 1}/{repeats}: " + ", ".join(f"{k} {v[-1]:.3f}"
                                                        for k, v in runs.items()), flush=True)
    median = {k: statistics.median(v) for k, v in runs.items()}
    return {"alone": {k: v for k, v in median.items() if "beside" not in k},
            "beside": {k: v for k, v in median.items() if "beside" in k}, "runs": runs}


def estimate(report: dict, m: dict, drill_scale: float = 1.0) -> dict:
    """Serial (the report), floor and two-lane wall seconds for the report's machine, with
    the receiver's drill stage scaled by ``drill_scale`` (e.g. 3 for 600 drill steps)."""
    a, b = m["alone"], m["beside"]

    def one_thread(shape: str) -> float:
        return a[f"{shape}@1"] / a[f"{shape}@2"]

    def beside(shape: str) -> float:
        return next(v for k, v in b.items() if k.startswith(f"{shape}@1 beside")) / a[f"{shape}@1"]

    rec = report["models"]["receiver"]
    # (seconds at 2 threads, 1-thread factor, slow-down beside the other lane). Probes and the
    # receiver's before-drill probes go with the nearest training shape (forward-only, an
    # approximation); the Qwen2 transmitter takes the Llama's slow-down (not measured).
    lane_a = [(rec["pretrain_seconds"], one_thread("receiver"), beside("receiver")),
              (rec["drill_seconds"] * drill_scale, one_thread("receiver-drill"),
               beside("receiver-drill")),
              (rec["train_seconds"] - rec["pretrain_seconds"] - rec["drill_seconds"]
               + rec["eval_seconds"], one_thread("receiver"), beside("receiver"))]
    lane_b = []
    for name, shape in (("transmitter-llama", "llama"), ("transmitter-qwen2", "qwen2"),
                        ("specialist", "llama")):
        e = report["models"][name]
        lane_b.append((e["train_seconds"] + e["eval_seconds"], one_thread(shape), beside("llama")))
    added = rec["drill_seconds"] * (drill_scale - 1)
    setup = report["total_seconds"] + added - sum(
        s for s, _, _ in lane_a + lane_b)   # world, tokenizers, writing folders
    serial = setup + sum(s for s, _, _ in lane_a + lane_b)
    floor = setup + sum(s * f for s, f, _ in lane_a + lane_b) / 2
    a1 = sum(s * f * x for s, f, x in lane_a)
    b1 = sum(s * f * x for s, f, x in lane_b)
    if b1 <= a1:   # lane B ends first; lane A does the rest of its work at 2 threads
        lanes = setup + b1 + (1 - b1 / a1) * sum(s for s, _, _ in lane_a)
    else:
        lanes = setup + a1 + (1 - a1 / b1) * sum(s for s, _, _ in lane_b)
    return {"serial": round(serial, 1), "floor": round(floor, 1), "two_lanes": round(lanes, 1),
            "lane_a_1thread": round(a1, 1), "lane_b_1thread": round(b1, 1),
            "setup": round(setup, 1), "drill_scale": drill_scale,
            "drill_steps": round(rec["spec"]["drill_steps"] * drill_scale)}


def render(result: dict) -> str:
    a, b = result["measured"]["alone"], result["measured"]["beside"]
    lines = ["Seconds per training step on this machine (the preset's shapes, random tokens; "
             f"median of {result['repeats']} rounds):", "",
             "| step | 2 threads | 1 thread alone | 2 threads' speed-up | 1 thread beside "
             "another training |", "|---|---|---|---|---|"]
    for shape in SHAPES:
        near = [v for k, v in b.items() if k.startswith(f"{shape}@1 beside")]
        lines.append(f"| {shape} | {a[f'{shape}@2']:.3f} | {a[f'{shape}@1']:.3f} | "
                     f"{a[f'{shape}@1'] / a[f'{shape}@2']:.2f}x | "
                     + (f"{near[0]:.3f} ({100 * (near[0] / a[f'{shape}@1'] - 1):+.0f}%)"
                        if near else "-") + " |")
    lines += ["", "Wall seconds of the whole preset, from each report's stage times (2 threads, "
              "one model after another) and the ratios above:", "",
              "| report | receiver drills | serial | two lanes | floor: every core busy at 1 "
              "thread, no interference | 10-minute target |", "|---|---|---|---|---|---|"]
    for name, e in result["estimates"].items():
        report = name.rsplit(" x", 1)[0]
        drills = (f"{e['drill_steps']} steps"
                  + (" (the report's)" if e["drill_scale"] == 1 else ", scaled from the report's"))
        lines.append(f"| {report} | {drills} | {e['serial']:.0f} | {e['two_lanes']:.0f} | "
                     f"{e['floor']:.0f} | {'within' if e['floor'] <= 600 else 'out of reach'} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        print(json.dumps(step_seconds(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0,
                    help="seconds of steps per measurement (after 3 warm-up steps)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds over every condition; the tables give the median")
    ap.add_argument("--report", nargs="+", type=Path, default=REPORTS,
                    help="preset reports (report.json) whose stage times to re-schedule")
    ap.add_argument("--drill-scale", type=float, default=3.0,
                    help="also estimate with the receiver's drills this many times longer "
                         "(3: the candidate v3 receiver's 600 drill steps)")
    ap.add_argument("--out", type=Path, default=RESULTS / "preset_lanes.json")
    args = ap.parse_args()
    if args.seconds <= 0 or args.drill_scale <= 0 or args.repeats < 1:
        raise SystemExit("--seconds and --drill-scale must be > 0, --repeats >= 1")
    reports = {}
    for path in args.report:
        if not path.exists():
            raise SystemExit(f"no preset report at {path}; give --report a report.json that "
                             "`plasticlm models pretrain --preset sandbox` wrote")
        reports[path.stem] = json.loads(path.read_text())
    from plasticlm.runs import machine

    measured = measure(args.seconds, args.repeats)
    result = {"machine": machine(), "loadavg": [round(x, 2) for x in os.getloadavg()],
              "seconds_per_measure": args.seconds, "repeats": args.repeats,
              "measured": measured,
              "estimates": {f"{k} x{scale:g}": estimate(r, measured, scale)
                            for scale in (1.0, args.drill_scale) for k, r in reports.items()}}
    result["table"] = render(result)
    print("\n" + result["table"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(result["table"] + "\n")


if __name__ == "__main__":
    main()
