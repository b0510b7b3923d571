"""``plasticlm demo``: the main job — the sandbox family, then each method's clearest result
beside its control, then the report."""

from __future__ import annotations

import argparse
import json

from plasticlm.cli.options import add_option_config, add_overwrite_option, add_runtime_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job (minutes on 2 CPU cores, with the "
                       "shipped sandbox family)",
                       description="The main job end to end: import a real llama2.c model "
                       "(when ../shared/data is there), install the shipped sandbox family, "
                       "stream 4K tokens through the memory in constant space, show FedNL's "
                       "memory reading beyond the attention window (beside windowed LoRA of "
                       "the same state), a trained FedRefine fuser carrying a transmitter's "
                       "knowledge to unseen entities (beside its ceiling and a transmitter "
                       "that knows nothing), one SCoL update writing a passage's facts "
                       "(beside the untouched model and an entity never shown), and each "
                       "paper's headline beside the run's verdict; then the report.")
    p.add_argument("--quick", action="store_true", help="the seconds-long quick preset (tests)")
    p.add_argument("--out", default="runs/demo", help="run folder")
    add_runtime_options(p)
    add_overwrite_option(p, "out")
    add_option_config(p)
    p.set_defaults(func=run_demo)


def _stories260k(run) -> None:
    import torch

    from plasticlm.eval import decodable_only
    from plasticlm.models import import_llama2c, load_causal_lm
    from plasticlm.runs import atomic_folder, cache_home, shared_data_dir

    print("== 1. A real pre-trained Llama (llama2.c stories260K) through the HF path ==")
    data = shared_data_dir()
    if not (data and (data / "models/stories260K/stories260K.bin").exists()):
        print("skipped: ../shared/data is absent (set PLASTICLM_DATA to the real-data folder)")
        return
    src = data / "models/stories260K"
    folder = cache_home() / "models" / "stories260K"
    with atomic_folder(folder) as tmp:   # marked, and only a folder plasticlm wrote is replaced
        import_llama2c(src / "stories260K.bin", src / "tok512.bin", tmp)
    model, tok = load_causal_lm(folder)
    out = model.generate(torch.tensor([[tok.bos_token_id]], device=model.device),
                         max_new_tokens=40, do_sample=False,
                         pad_token_id=tok.pad_token_id, logits_processor=decodable_only(tok))
    text = tok.decode(out[0], skip_special_tokens=True)
    print(f"greedy from BOS: {text!r}")
    (run.path / "stories260k.md").write_text(f"Greedy from BOS: {text!r}\n")
    run.log(stage="stories260K", greedy=text)


def _sandbox(run, preset: str) -> None:
    from plasticlm.sandbox import ensure_sandbox_models, preset_dir, probe_table

    print(f"== 2. The sandbox world and its model family (preset {preset!r}) ==")
    ensure_sandbox_models(preset)
    report = json.loads((preset_dir(preset) / "report.json").read_text())
    print(probe_table(report))
    (run.path / "sandbox.md").write_text(probe_table(report) + "\n")
    run.log(stage="sandbox", preset=preset, seconds=report.get("total_seconds"),
            sandbox_version=report.get("sandbox_version"))


def _memory(run, preset: str, tokens: int) -> None:
    import torch

    from plasticlm.memory import MemoryStream, attach_memory
    from plasticlm.models import load_causal_lm
    from plasticlm.sandbox import sandbox_model

    print(f"== 3. O(1) streaming: {tokens} tokens through the receiver with memory ==")
    model, tok = load_causal_lm(sandbox_model("receiver", preset=preset))
    cfg = model.config
    attach_memory(model, layers="all", window=64, rank=8)
    stream = MemoryStream(model, chunk_tokens=256)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, cfg.vocab_size, (1, tokens), generator=gen)
    sizes = []
    for start in range(0, tokens, 1024):
        stream.feed(ids[:, start:start + 1024], keep="last")
        sizes.append(stream.state_bytes())
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    table = ["| tokens read | stream state (window + memory), KiB | full KV cache, KiB |",
             "|---|---|---|"] + [f"| {1024 * (i + 1)} | {s / 1024:.0f} | {kv * (i + 1):.0f} |"
                                 for i, s in enumerate(sizes)]
    print("\n".join(table))
    (run.path / "memory.md").write_text("\n".join(table) + "\n")
    run.log(stage="memory", state_bytes=sizes, kv_bytes_per_token=kv)


def _federated(run, preset: str, quick: bool) -> dict:
    from plasticlm.experiments.fednl.beyond_window import (
        BASELINE,
        beyond_window_table,
        run_beyond_window,
    )
    from plasticlm.plotting import interval_bars
    from plasticlm.sandbox import get_preset, sandbox_model
    from plasticlm.sandbox.world import generate_world

    variants = ("window, untrained", BASELINE, "memory (FedNL theta)")
    # Sized for ~2-3 min on 2 cores (sandbox); the memory's gain keeps its interval above 0.
    # The quick tokenizer needs 128-token samples to leave a haystack.
    sizes = (dict(steps=2, batch=2, seeds=1, max_test=8, niah_length=128) if quick else
             dict(steps=40, batch=8, seeds=3, max_test=120, niah_length=96))
    print(f"== 4. FedNL's memory reads beyond the attention window: a needle in the first 40% of "
          f"a {sizes['niah_length']}-token sample, 16-token attention, 4-way choice; theta "
          "trained centrally (the mechanism FedNL federates); the memory beside window + LoRA "
          "(FedAvg's theta, the same O(1) state) and the untrained window (the control) ==")
    report = run_beyond_window(sandbox_model("receiver", preset=preset),
                               generate_world(get_preset(preset).world), "niah", variants,
                               window=16, progress=not quick, **sizes)
    report = {"preset": preset, **report}
    table = beyond_window_table(report)
    print(table)
    print("the federated run on Flower (clients, rounds, FedAvg/FedProx beside FedNL): "
          "plasticlm fednl experiment niah")
    (run.path / "fednl.md").write_text(table + "\n")
    interval_bars(run.path / "fednl.png", "FedNL: needles beyond a 16-token window (theta "
                  "trained centrally)", [(v, 100 * r["accuracy"], 100 * r["low"], 100 * r["high"])
                                         for v, r in report["table"].items()],
                  "4-way accuracy, % [95% CI]", chance=25)
    (run.path / "fednl").mkdir(parents=True, exist_ok=True)
    (run.path / "fednl" / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    rows = report["table"]
    run.log(stage="fednl", task="niah", window=16, **sizes,
            accuracy={v: round(r["accuracy"], 4) for v, r in rows.items()},
            memory_minus_window_lora=[round(rows["memory (FedNL theta)"][k], 4)
                                      for k in ("minus_window_lora", "diff_low", "diff_high")],
            seconds=round(sum(sum(r["seconds"]) for r in rows.values()), 1))
    memory = rows["memory (FedNL theta)"]
    return {"mean": memory["minus_window_lora"], "low": memory["diff_low"],
            "high": memory["diff_high"]}


def _refine(run, preset: str, quick: bool) -> dict:
    from plasticlm.config import load_config, preset_path
    from plasticlm.experiments.refine.ladder_table import ladder_table, run_ladder
    from plasticlm.experiments.refine.rungs import LABELS, LadderConfig
    from plasticlm.plotting import interval_bars

    print("== 5. FedRefine: a fuser carries what the transmitter knows to entities it never "
          "trained on. The transmitter (the oracle) is the receiver taught every specialist "
          "fact; the ceiling hands its cache over untouched; a C2C fuser trained to reproduce "
          "that cache on dev/val prompts (rung c), one seed, beside the same fuser from the "
          "receiver itself, which knows none of the facts (the control) ==")
    sizes = ([] if quick else [f"receiver={preset}:receiver", f"specialist={preset}:specialist",
                               f"control={preset}:transmitter-llama"])
    cfg = load_config(LadderConfig, None,
                      [*sizes, "seeds=1", 'rungs=["handover", "regression"]',
                       f"out={run.path / 'refine'}", f"progress={str(not quick).lower()}"],
                      preset=preset_path("refine", "ladder-quick") if quick else None)
    report = run_ladder(cfg)
    stamp = json.loads((run.path / "refine" / "taught" / "oracle" / "taught.json").read_text())
    print("the oracle: " + ("the shipped copy, checked against its SHA-256 manifest"
                            if stamp.get("shipped") else
                            f"taught in this run ({cfg.teach_steps} drills; no shipped copy "
                            "was taught from this receiver)"))
    print(ladder_table(report))
    print("every rung over 3 seeds, the recipe on general data (89% of the ceiling) and the "
          "heterogeneous specialist (nothing beyond its control on the sandbox): `plasticlm "
          "refine experiment ladder` (about 40 min; docs/results/refine.md)")
    results = report["results"]
    interval_bars(run.path / "refine.png", "FedRefine: held-out entities, rung c (one seed) "
                  "beside its ceiling and controls",
                  [(name, 100 * r["accuracy"]["mean"], 100 * r["accuracy"]["low"],
                    100 * r["accuracy"]["high"]) for name, r in results.items()
                   if name != "transmitter alone, oracle"],
                  "4-way accuracy, % [95% CI]", chance=25)
    rung_c = results[LABELS["regression"][0]]
    run.log(stage="refine", rows=list(results),
            rung_c_minus_control=[round(rung_c["minus_control"][k], 4)
                                  for k in ("mean", "low", "high")],
            fraction_of_ceiling=rung_c.get("fraction_of_ceiling"))   # None: no ceiling span
    return rung_c


def _scol(run, preset: str, quick: bool) -> dict:
    from plasticlm.experiments.scol.one_update import (
        DEMO_SIZES,
        QUICK_SIZES,
        one_update_table,
        run_one_update,
    )
    from plasticlm.plotting import interval_bars
    from plasticlm.sandbox import get_preset, sandbox_model
    from plasticlm.sandbox.world import generate_world

    print("== 6. SCoL's inner update writes a passage's facts into the weights: one LoRA update "
          "of the last layer's MLP per unseen-entity passage, its questions answered by "
          "closed-set ranking; beside the untouched model and the same question about an "
          "entity never shown (the value-prior control) ==")
    sizes = QUICK_SIZES if quick else DEMO_SIZES
    report = run_one_update(sandbox_model("receiver", preset=preset),
                            generate_world(get_preset(preset).world), progress=not quick,
                            **sizes)
    table = one_update_table(report)
    print(table)
    print("the policy that names the layers (IPO) over a stream, beside an untrained policy "
          "and a fixed last layer, is `plasticlm scol experiment squad`: on the sandbox no "
          "policy beats the fixed last layer (docs/results/scol.md)")
    (run.path / "scol.md").write_text(table + "\n")
    rows = [(report["table"][k]["name"], *(100 * report["table"][k]["accuracy"][x]
                                           for x in ("mean", "low", "high")))
            for k in ("a", "b", "c", "a2", "c_leak", "a2_leak")]
    interval_bars(run.path / "scol.png", "SCoL: one update of the last layer's MLP", rows,
                  "closed-set accuracy, % [95% CI]", chance=100 * report["chance"])
    (run.path / "scol").mkdir(parents=True, exist_ok=True)
    (run.path / "scol" / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    diffs = {k: [round(report["table"][k]["pooled"][x], 4) for x in ("mean", "low", "high")]
             for k in ("b-a", "b-c_leak")}
    run.log(stage="scol", **sizes, differences=diffs)
    return report["table"]["b-c_leak"]["pooled"]


def _headlines(run, fednl: dict, refine: dict, scol: dict) -> None:
    """Each paper's headline beside the result of this run that tests its mechanism, and the
    verdict the run's own interval gives; what the run does not test, said."""
    from plasticlm.fednl.report import PAPER as FEDNL
    from plasticlm.refine.report import PAPER as REFINE
    from plasticlm.scol.baselines import SCOL_METHODS

    print("== 7. The papers' headlines beside this run (each a different task and scale: "
          "read the verdict, not the numbers side by side) ==")
    squad = SCOL_METHODS["scol"].paper
    rows = [("FedNL", f"NIAH-7, 7 clients, federated: {FEDNL['niah_acc']['fednl']:.1f}% vs "
             f"{FEDNL['niah_acc']['fedala']:.1f}% for FedALA, the best baseline",
             "the memory minus windowed LoRA of the same O(1) state, theta trained centrally",
             fednl, "federated NIAH-7: `plasticlm fednl experiment niah`"),
            ("FedRefine", f"four transmitters' caches: +{REFINE['multi_all_vs_alone_pct']}% "
             "over the receiver alone", "rung c (a trained fuser from the oracle) minus the "
             "same fuser from the receiver, which knows none of the facts", refine["minus_control"],
             "heterogeneous transmitters: `plasticlm refine experiment ladder` (rung g)"),
            ("SCoL", f"SQuAD, 100 passages: immediate {100 * squad['immediate']:.2f}%, "
             f"retention {100 * squad['retention']:.2f}%", "one update of the last layer "
             "writes its own entity's facts, beyond the value prior it shifts", scol,
             "the learned layer choice: `plasticlm scol experiment policy`")]
    lines = ["| method | the paper's headline | this run: the mechanism it rests on | "
             "difference, pp [95% CI] | the mechanism, here | not tested here |", "|---|---|---|---|---|---|"]
    for method, paper, ours, d, rest in rows:
        verdict = ("holds (interval above 0)" if d["low"] > 0 else
                   "not shown (interval reaches 0)")
        lines.append(f"| {method} | {paper} | {ours} | {100 * d['mean']:+.1f} "
                     f"[{100 * d['low']:.1f}, {100 * d['high']:.1f}] | {verdict} | {rest} |")
    table = "\n".join(lines)
    print(table)
    (run.path / "headlines.md").write_text(table + "\n")
    run.log(stage="headlines", verdicts={r[0]: r[3]["low"] > 0 for r in rows})


def run_demo(args) -> int:
    import resource
    import time

    from plasticlm.run_report import write_report
    from plasticlm.runs import RunDir, clear_run_folder
    from plasticlm.runtime import seed_everything

    def cpu() -> float:
        return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF,
                   resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))

    start, cpu0 = time.time(), cpu()
    seed_everything(0)
    clear_run_folder(args.out, "give the demo another --out")
    run = RunDir.create("", {"quick": args.quick}, root=args.out)
    preset = "quick" if args.quick else "sandbox"
    if args.quick:
        print("smoke run (--quick, tiny models, a few items): numbers mean nothing")
    _stories260k(run)
    _sandbox(run, preset)
    _memory(run, preset, 2048 if args.quick else 4096)
    fednl = _federated(run, preset, args.quick)
    refine = _refine(run, preset, args.quick)
    scol = _scol(run, preset, args.quick)
    _headlines(run, fednl, refine, scol)
    run.log(stage="end", wall_seconds=round(time.time() - start, 1),
            cpu_seconds=round(cpu() - cpu0, 1))
    page, _ = write_report(run.path)
    print(f"\nreport: {page}  (open it in a browser; index.md beside it)")
    print(f"run folder: {run.path}")
    return 0
