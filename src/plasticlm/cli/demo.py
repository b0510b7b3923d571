"""``plasticlm demo``: the main job — the sandbox family, the memory, a federated run."""

from __future__ import annotations

import argparse
import dataclasses
import json

from plasticlm.cli.options import add_overwrite_option, add_runtime_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job (minutes on 2 CPU cores; the first run "
                       "also pre-trains the sandbox models)",
                       description="The main job end to end: import a real llama2.c model "
                       "(when ../shared/data is there), pre-train (or reuse) the sandbox model "
                       "family, stream 4K tokens through the memory in constant space, run "
                       "FedNL against FedAvg on Flower with five domain clients, fuse the "
                       "specialist's cache into the receiver (FedRefine), and consolidate a "
                       "stream of passages into the receiver's weights (SCoL).")
    p.add_argument("--quick", action="store_true", help="the seconds-long quick preset (tests)")
    p.add_argument("--out", default="runs/demo", help="run folder")
    add_runtime_options(p)
    add_overwrite_option(p, "out")
    p.set_defaults(func=run_demo)


def _stories260k(run) -> None:
    import torch

    from plasticlm.eval import decodable_only
    from plasticlm.models import import_llama2c, load_causal_lm
    from plasticlm.runs import cache_home, shared_data_dir

    print("== 1. A real pre-trained Llama (llama2.c stories260K) through the HF path ==")
    data = shared_data_dir()
    if not (data and (data / "models/stories260K/stories260K.bin").exists()):
        print("skipped: ../shared/data is absent (set PLASTICLM_DATA to the real-data folder)")
        return
    src = data / "models/stories260K"
    folder = import_llama2c(src / "stories260K.bin", src / "tok512.bin",
                            cache_home() / "models" / "stories260K")
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


def _federated(run, preset: str, quick: bool) -> None:
    from plasticlm.fednl.beyond_window import BASELINE, beyond_window_table, run_beyond_window
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
    (run.path / "fednl").mkdir(parents=True, exist_ok=True)
    (run.path / "fednl" / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    rows = report["table"]
    run.log(stage="fednl", task="niah", window=16, **sizes,
            accuracy={v: round(r["accuracy"], 4) for v, r in rows.items()},
            memory_minus_window_lora=[round(rows["memory (FedNL theta)"][k], 4)
                                      for k in ("minus_window_lora", "diff_low", "diff_high")],
            seconds=round(sum(sum(r["seconds"]) for r in rows.values()), 1))


def _refine(run, preset: str, quick: bool) -> None:
    from plasticlm.config import load_config, preset_path
    from plasticlm.refine.ladder import TransferConfig
    from plasticlm.refine.report import transfer_table
    from plasticlm.refine.transfer import run_transfer

    print("== 5. FedRefine: does the specialist's cache carry what it knows to unseen "
          "entities, beyond a transmitter that knows nothing? ==")
    sizes = ([] if quick else [f"receiver={preset}:receiver", f"specialist={preset}:specialist",
                               f"control={preset}:transmitter-llama", "general_examples=300",
                               "max_eval=120", "fuser.epochs=1"])
    cfg = load_config(TransferConfig, None, [*sizes, "seeds=1", 'rows=["general"]',
                                             f"out={run.path / 'refine'}", "progress=false"],
                      preset=preset_path("refine", "transfer-quick") if quick else None)
    report = run_transfer(cfg)
    print(transfer_table(report))
    run.log(stage="refine", rows=sorted(report["results"]))


def _scol(run, preset: str, quick: bool) -> None:
    from plasticlm.scol.experiment import run_squad
    from plasticlm.scol.setup import ExperimentConfig, quick_config

    print("== 6. SCoL: a stream of passages consolidated into the weights, the model choosing "
          "the layers; beside an untrained policy and a fixed last layer ==")
    # Small: each update replays generic text (the calibrated default), about 3 s a commit.
    base = quick_config() if quick else ExperimentConfig(train_streams=2, stream_length=3,
                                                         eval_length=6)
    cfg = dataclasses.replace(base, preset=preset, seeds=1,
                              methods=("scol", "untrained_policy", "fixed_last", "sequential_ft"),
                              scol=base.scol if quick else dataclasses.replace(base.scol,
                                                                               outer_steps=1))
    report = run_squad(cfg, run.path / "scol", progress=not quick)
    print((run.path / "scol" / "report.md").read_text())
    run.log(stage="scol", methods=sorted(report["summary"]))


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
    _stories260k(run)
    _sandbox(run, preset)
    _memory(run, preset, 2048 if args.quick else 4096)
    _federated(run, preset, args.quick)
    _refine(run, preset, args.quick)
    _scol(run, preset, args.quick)
    run.log(stage="end", wall_seconds=round(time.time() - start, 1),
            cpu_seconds=round(cpu() - cpu0, 1))
    page, _ = write_report(run.path)
    print(f"\nreport: {page}  (open it in a browser; index.md beside it)")
    print(f"run folder: {run.path}")
    return 0
