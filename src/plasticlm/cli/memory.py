"""``plasticlm memory``: FedNL's delta-rule memory — the MQAR recall experiment, adapter info."""

from __future__ import annotations

import argparse
import json

from plasticlm.cli.options import THREADS, add_config_options, load_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("memory", help="delta-rule memory: recall experiment, adapter info",
                       description="FedNL's memory-augmented attention (delta rule + windowed softmax).")
    msub = p.add_subparsers(dest="memory_command", required=True, metavar="ACTION")

    q = msub.add_parser("mqar", help="train window-only vs window+memory on MQAR and compare recall",
                        description="Train a 2-layer tiny Llama from scratch twice with the same budget "
                        "(window alone; window + delta-rule memory) on multi-query associative recall, "
                        "then print and save both accuracies.")
    q.add_argument("--threads", type=THREADS, default=None,
                   help="torch CPU threads (the same as --set threads=N)")
    q.add_argument("--out", default="runs/mqar", help="run folder for config.json and result.json")
    add_config_options(q, "plasticlm.experiments.memory.mqar_config:MQARConfig")
    q.set_defaults(func=_mqar)

    q = msub.add_parser("info", help="print a saved memory adapter's config and size",
                        description="Print the MemoryConfig and theta size of a folder written by "
                        "plasticlm.memory.save_pretrained.")
    q.add_argument("adapter_dir")
    q.set_defaults(func=_info)


def _mqar(args) -> int:
    from plasticlm.errors import PlasticError
    from plasticlm.experiments.memory.mqar import run_mqar
    from plasticlm.experiments.memory.mqar_config import MQARConfig
    from plasticlm.runs import RunDir

    extra = []
    if args.threads is not None:
        if any(o.split("=", 1)[0].strip() == "threads" for o in args.overrides):
            raise PlasticError("give --threads N or --set threads=N, not both")
        extra = [f"threads={args.threads}"]
    config = load_from_args(MQARConfig, args, extra)   # refused before the run folder exists
    run = RunDir(args.out)
    run.write_json("config.json", config)
    results = run_mqar(config)
    run.write_json("result.json", results)
    for key in ("window_only", "memory"):
        print(f"{key:12s} {json.dumps(results[key]['test_accuracy'])}  ({results[key]['train_seconds']} s)")
    print(f"wrote {run.path / 'result.json'}")
    return 0


def _info(args) -> int:
    from pathlib import Path

    from plasticlm.errors import PlasticError
    from plasticlm.memory.adapter import CONFIG_FILE, THETA_FILE

    folder = Path(args.adapter_dir)
    if not (folder / CONFIG_FILE).exists():
        raise PlasticError(f"{folder} has no {CONFIG_FILE}; is it a saved memory adapter?")
    print((folder / CONFIG_FILE).read_text().strip())
    theta = folder / THETA_FILE
    if theta.exists():
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(theta), "pt") as f:
                numel = sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())
        except (SafetensorError, OSError, ValueError) as e:   # truncated, garbage, nested
            raise PlasticError(f"{theta} is not a readable safetensors file ({e})") from None
        print(f"theta: {numel} parameters, file {theta.stat().st_size} bytes")
    return 0


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
