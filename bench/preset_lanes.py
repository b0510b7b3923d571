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
    python bench/preset_lanes.py --smoke   # one pair live at a tiny batch; a temp folder

``--smoke`` times one side-by-side pair (the receiver's pre-training step beside the
Llama's, one row of 17 tokens, 6 steps each), then estimates and renders from the committed
measurements (results/preset_lanes.json) into a temp folder: every condition live would
take ten worker processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
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
# Side-by-side pairs: the receiver's lane beside the Llama shape of the other lane.
LANE_A = ("receiver", "receiver-drill")
PAIRS = tuple((shape, "llama") for shape in LANE_A)
WARMUP = 3
STARTUP = 6.0    # seconds for side-by-side workers to import torch and build their models


def step_seconds(shape: str, threads: int, seconds: float, start_at: float,
                 tiny: bool = False) -> dict:
    """Mean seconds per AdamW step of ``shape`` at ``threads`` threads over ``seconds``,
    timed from ``start_at`` (wall clock) on, so that workers started together overlap;
    ``tiny``: one row of 17 tokens (a smoke check)."""
    import torch

    from plasticlm.models.pretrain import lm_loss
    from plasticlm.sandbox import get_preset
    from plasticlm.sandbox.pretrain import build_model

    torch.set_num_threads(threads)
    name, batch, width = SHAPES[shape]
    if tiny:
        batch, width = 1, 17
    preset = get_preset("sandbox")
    spec = next(m for m in preset.models if m.name == name)
    vocab = next(t.vocab_size for t in preset.tokenizers if t.name == spec.tokenizer)
    model = build_model(spec, vocab, max(2048, 4 * preset.seq_len))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(vocab, (batch, width), generator=torch.Generator().manual_seed(0))
    late = time.time() - start_at   # > 0: this worker was not ready when timing began
    time.sleep(max(0.0, -late))
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
            "seconds_per_step": sum(kept) / len(kept), "late": round(max(0.0, late), 2)}


def _workers(jobs: list[tuple[str, int]], seconds: float, tiny: bool = False) -> list[dict]:
    """Run ``(shape, threads)`` jobs at once, each in its own process, timing from one
    moment on (after every worker has imported torch and built its model)."""
    start_at = time.time() + STARTUP
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", shape, str(threads),
                               str(seconds), str(start_at), *(["tiny"] if tiny else [])],
                              stdout=subprocess.PIPE, text=True)
             for shape, threads in jobs]
    out = []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"a worker failed (exit {p.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    if len(out) > 1 and any(r["late"] > 0 for r in out):
        print(f"warning: a side-by-side worker started {max(r['late'] for r in out):.1f} s "
              f"late, so the pair overlapped less; raise STARTUP ({STARTUP} s)", flush=True)
    return out


def measure(seconds: float, repeats: int, shapes=tuple(SHAPES), pairs=PAIRS,
            tiny: bool = False) -> dict:
    """Seconds per step of every shape alone (1 and 2 threads) and of each of PAIRS side by
    side (1 thread each), over ``repeats`` rounds that visit every condition once, so that a
    drift of the machine's speed spreads over all of them. Returns every round's values.
    ``shapes``, ``pairs`` and ``tiny`` (one row of 17 tokens) cut it down for a smoke check."""
    runs: dict[str, list[float]] = {}
    for r in range(repeats):
        for shape in shapes:
            for threads in (2, 1):
                runs.setdefault(f"{shape}@{threads}", []).append(
                    _workers([(shape, threads)], seconds, tiny)[0]["seconds_per_step"])
        for a, b in pairs:
            ra, rb = _workers([(a, 1), (b, 1)], seconds, tiny)
            runs.setdefault(_beside(a, b), []).append(ra["seconds_per_step"])
            runs.setdefault(_beside(b, a), []).append(rb["seconds_per_step"])
        print(f"round {r + 1}/{repeats}: " + ", ".join(f"{k} {v[-1]:.3f}"
                                                        for k, v in runs.items()), flush=True)
    return runs


def _beside(shape: str, other: str) -> str:
    return f"{shape}@1 beside {other}"


def _lanes(a: list[dict], b: list[dict]) -> float:
    """Wall seconds of two lanes of stages run side by side, each stage ``{"two": seconds at
    2 threads alone, "one": at 1 thread alone, "shape": ..., "slow": {other shape: factor}}``:
    while both lanes run, each stage goes at its 1-thread speed slowed by ``slow[the other
    lane's current shape]``; a lane left alone runs its stages at 2 threads."""
    lanes = [[dict(x, left=1.0) for x in lane if x["two"] > 0] for lane in (a, b)]
    t = 0.0
    while all(lanes):
        x, y = lanes[0][0], lanes[1][0]
        rate_x = 1 / (x["one"] * x["slow"][y["shape"]])   # fraction of the stage per second
        rate_y = 1 / (y["one"] * y["slow"][x["shape"]])
        dt = min(x["left"] / rate_x, y["left"] / rate_y)
        t += dt
        x["left"] -= dt * rate_x
        y["left"] -= dt * rate_y
        for lane in lanes:
            if lane[0]["left"] <= 1e-12:
                lane.pop(0)
    rest = lanes[0] or lanes[1]
    return t + sum(x["left"] * x["two"] for x in rest)


def estimate(report: dict, m: dict[str, float], drill_scale: float = 1.0) -> dict:
    """One-after-another (the report's), floor and two-lane wall seconds for the machine of
    ``report`` (its stage seconds at 2 threads, scaled by this machine's ratios ``m``), with
    the receiver's drill stage scaled by ``drill_scale`` (e.g. 3 for 600 drill steps)."""

    def one(shape: str) -> float:
        return m[f"{shape}@1"] / m[f"{shape}@2"]

    def slow(shape: str) -> dict[str, float]:
        # The slow-down beside each shape of the other lane. The receiver's lane was paired
        # with the Llama shape only, so the Qwen2 transmitter takes the Llama's figures.
        if shape in LANE_A:
            f = m[_beside(shape, "llama")] / m[f"{shape}@1"]
            return {"llama": f, "qwen2": f}
        return {other: m[_beside("llama", other)] / m["llama@1"] for other in LANE_A}

    def stage(seconds: float, shape: str) -> dict:
        return {"two": seconds, "one": seconds * one(shape), "shape": shape, "slow": slow(shape)}

    rec = report["models"]["receiver"]
    probes = rec["train_seconds"] - rec["pretrain_seconds"] - rec["drill_seconds"]
    # Probes go with the nearest training shape (forward-only, an approximation).
    lane_a = [stage(rec["pretrain_seconds"], "receiver"),
              stage(rec["drill_seconds"] * drill_scale, "receiver-drill"),
              stage(probes + rec["eval_seconds"], "receiver")]
    # The specialist starts from the Llama transmitter's weights, so it follows it.
    lane_b = [stage(report["models"][name]["train_seconds"]
                    + report["models"][name]["eval_seconds"], shape)
              for name, shape in (("transmitter-llama", "llama"), ("specialist", "llama"),
                                  ("transmitter-qwen2", "qwen2"))]
    staged = sum(x["two"] for x in lane_a + lane_b)
    setup = report["total_seconds"] + rec["drill_seconds"] * (drill_scale - 1) - staged
    return {"serial": round(setup + staged, 1),
            "floor": round(setup + sum(x["one"] for x in lane_a + lane_b) / 2, 1),
            "two_lanes": round(setup + _lanes(lane_a, lane_b), 1),
            "others_seconds": round(sum(x["two"] for x in lane_b), 1),
            "receiver_seconds": round(sum(x["two"] for x in lane_a), 1),
            "setup": round(setup, 1), "drill_scale": drill_scale,
            "drill_steps": round(rec["spec"]["drill_steps"] * drill_scale)}


def _median(runs: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in runs.items()}


def _rounds(runs: dict[str, list[float]]) -> list[dict[str, float]]:
    return [{k: v[i] for k, v in runs.items()} for i in range(len(next(iter(runs.values()))))]


def render(result: dict) -> str:
    m = _median(result["measured"])
    lines = ["Seconds per training step on this machine (the preset's shapes, random tokens; "
             f"median of {result['repeats']} rounds):", "",
             "| step | 2 threads | 1 thread alone | 2 threads' speed-up |", "|---|---|---|---|"]
    for shape in SHAPES:
        lines.append(f"| {shape} | {m[f'{shape}@2']:.3f} | {m[f'{shape}@1']:.3f} | "
                     f"{m[f'{shape}@1'] / m[f'{shape}@2']:.2f}x |")
    lines += ["", "Side by side, 1 thread each (both timed over the same seconds); the Qwen2 "
              "transmitter was not paired and takes the Llama's figures:", "",
              "| step | beside | seconds per step | against alone |", "|---|---|---|---|"]
    for a, b in PAIRS:
        for x, y in ((a, b), (b, a)):
            v = m[_beside(x, y)]
            lines.append(f"| {x} | {y} | {v:.3f} | {100 * (v / m[f'{x}@1'] - 1):+.0f}% |")
    lines += ["", "Wall seconds of the whole preset, from each report's stage times (2 threads, "
              "one model after another) and the ratios above; the floor's range is over the "
              "rounds:", "",
              "| report | receiver drills | one after another | two lanes | floor: every core "
              "busy at 1 thread, no interference | rounds whose floor is <= 600 s |",
              "|---|---|---|---|---|---|"]
    for name, e in result["estimates"].items():
        report = name.rsplit(" x", 1)[0]
        drills = (f"{e['drill_steps']} steps"
                  + (" (the report's)" if e["drill_scale"] == 1 else ", scaled from the report's"))
        lo, hi = min(e["floor_rounds"]), max(e["floor_rounds"])
        lines.append(f"| {report} | {drills} | {e['serial']:.0f} | {e['two_lanes']:.0f} | "
                     f"{e['floor']:.0f} ({lo:.0f}-{hi:.0f}) | "
                     f"{sum(x <= 600 for x in e['floor_rounds'])} of {len(e['floor_rounds'])} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) in (6, 7) and sys.argv[1] == "--worker":
        print(json.dumps(step_seconds(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]),
                                      float(sys.argv[5]), tiny=sys.argv[6:] == ["tiny"])))
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
    ap.add_argument("--from-json", type=Path, default=None,
                    help="estimate and render again from a saved result's measurements")
    ap.add_argument("--smoke", action="store_true", help="one pair live at a tiny batch, the "
                    "estimates from the committed measurements, written to a temp folder")
    args = ap.parse_args()
    if args.seconds <= 0 or args.drill_scale <= 0 or args.repeats < 1:
        raise SystemExit("--seconds and --drill-scale must be > 0, --repeats >= 1")
    reports = {}
    for path in args.report:
        if not path.exists():
            raise SystemExit(f"no preset report at {path}; give --report a report.json that "
                             "`plasticlm models pretrain --preset sandbox` wrote")
        reports[path.stem] = json.loads(path.read_text())
    from plasticlm.runtime import machine

    if args.smoke:
        live = measure(0.0, 1, shapes=(), pairs=PAIRS[:1], tiny=True)
        print("smoke: one pair live, 1 row of 17 tokens: " + ", ".join(
            f"{k} {v[0]:.4f} s per step" for k, v in live.items()), flush=True)
        result = json.loads((RESULTS / "preset_lanes.json").read_text())
        args.out = Path(tempfile.mkdtemp(prefix="bench-smoke-")) / "preset_lanes.json"
    elif args.from_json:
        result = json.loads(args.from_json.read_text())
        if "loadavg_start" not in result:
            raise SystemExit(f"{args.from_json} predates the per-round measurements; run the "
                             "bench again")
        args.out = args.from_json
    else:
        start = [round(x, 2) for x in os.getloadavg()]
        runs = measure(args.seconds, args.repeats)
        result = {"machine": machine(), "loadavg_start": start,
                  "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                  "seconds_per_measure": args.seconds, "repeats": args.repeats,
                  "measured": runs}
    runs = result["measured"]
    result["estimates"] = {}
    for scale in dict.fromkeys((1.0, args.drill_scale)):
        for k, r in reports.items():
            e = estimate(r, _median(runs), scale)
            e["floor_rounds"] = [estimate(r, one, scale)["floor"] for one in _rounds(runs)]
            result["estimates"][f"{k} x{scale:g}"] = e
    result["table"] = render(result)
    print("\n" + result["table"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(result["table"] + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
