"""``plasticlm scol``: meta-train a SCoL policy, consolidate a stream with it, experiments."""

from __future__ import annotations

import argparse
import json

from plasticlm.cli.options import add_config_options, add_runtime_options, load_from_args, non_empty
from plasticlm.errors import PlasticError
from plasticlm.outputs import prepare_output
from plasticlm.run_report import write_report

# first line of what `scol experiment --quick` prints: its sizes are a smoke test's
SMOKE_LINE = "smoke run: numbers mean nothing"


def _common(p: argparse.ArgumentParser) -> None:
    add_config_options(p, "plasticlm.experiments.scol.setup:ExperimentConfig", quick="scol/quick")
    add_runtime_options(p, float32_only="SCoL merges LoRA deltas into the weights, and "
                        "deltas of 1e-4 relative vanish in bfloat16")
    p.add_argument("--no-progress", action="store_true")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scol", help="self-consolidating LMs: the model picks layers to learn",
                       description="SCoL: each context of a stream is written into the weights "
                       "by LoRA on layers the model itself names in text; IPO teaches the "
                       "choice.")
    vs = p.add_subparsers(dest="scol_command", required=True, metavar="VERB")

    q = vs.add_parser("train", help="meta-train the policy (IPO) over training streams",
                      description="Meta-train theta_0 over training streams; checkpoints in "
                      "OUT/checkpoint (resume with --resume).")
    _common(q)
    q.add_argument("--out", default="runs/scol-train")
    q.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    q.set_defaults(func=_train)

    q = vs.add_parser("run", help="consolidate the evaluation stream with a trained policy",
                      description="Consolidate the evaluation stream (greedy actions of the "
                      "policy), fill the accuracy matrix, save the consolidated model.")
    _common(q)
    q.add_argument("--policy", required=True, type=non_empty,
                   help="a checkpoint folder from `scol train`")
    q.add_argument("--out", default="runs/scol-run")
    q.set_defaults(func=_run)

    q = vs.add_parser("experiment",
                      help="squad | longbench | fisher | sweep | gate | oracle | policy, with reports",
                      description="Run an experiment; report.json/report.md and PNG plots go "
                      "into OUT. 'sweep' calibrates the inner update (LoRA modules, steps, "
                      "lr, rank, replay) on the evaluation stream; 'gate' asks whether the best "
                      "per-context layer choice beats the best fixed one (the oracle gate); "
                      "'oracle' searches every layer set at each context of a stream whose facts collide and gives "
                      "the margin of a perfect choice over the fixed last layer, the untrained "
                      "policy and random layers; 'policy' trains the policy by IPO on the pairs "
                      "of exhaustive candidates and compares its choices on held-out contexts "
                      "with the untrained policy, the last layer and the best fixed layer.")
    q.add_argument("which",
                   choices=("squad", "longbench", "fisher", "sweep", "gate", "oracle", "policy"))
    _common(q)
    q.add_argument("--policy", type=non_empty,
                   help="fisher: policy checkpoint (default: the base model)")
    q.add_argument("--sweep", action="append", default=[], metavar="KEY=VALUE",
                   help="sweep: grid overrides, e.g. --sweep 'lr=[1e-3,3e-3]' --sweep "
                   "'modules=[\"mlp\"]'")
    q.add_argument("--out", default=None, help="run folder (default runs/scol-<which>, with "
                   "--quick runs/scol-<which>-quick)")
    q.set_defaults(func=_experiment)


def _config(args):
    """ExperimentConfig: defaults (or the --quick preset), then --config, then --set (e.g.
    ``--set model=DIR --set squad=FILE`` for real data)."""
    from plasticlm.experiments.scol.setup import ExperimentConfig

    return load_from_args(ExperimentConfig, args)


def _train(args) -> int:
    from plasticlm.data.squad import load_squad
    from plasticlm.experiments.scol.setup import load_model, replay_pool, resolve_world_file
    from plasticlm.scol.contexts import contexts_from_passages, split_streams
    from plasticlm.scol.meta import meta_train

    cfg = _config(args)
    model, tok = load_model(cfg)
    contexts = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")))
    train, _ = split_streams(contexts, cfg.train_streams, cfg.stream_length, cfg.eval_length,
                             cfg.seed)
    meta_train(model, tok, train, cfg.scol, args.out, resume=args.resume,
               progress=not args.no_progress, replay=replay_pool(cfg, tok))
    print(f"policy checkpoint: {args.out}/checkpoint (metrics: {args.out}/metrics.jsonl)")
    return 0


def _check_policy(path: str) -> None:
    from pathlib import Path

    if not (Path(path) / "config.json").is_file():
        raise PlasticError(f"--policy {path} is not a policy checkpoint folder (`plasticlm scol "
                           "train` writes one: OUT/checkpoint)")


def _run(args) -> int:

    from plasticlm.data.squad import load_squad
    from plasticlm.experiments.scol.setup import load_model, replay_pool, resolve_world_file
    from plasticlm.models import load_causal_lm
    from plasticlm.scol.consolidate import float32_master
    from plasticlm.scol.contexts import contexts_from_passages, split_streams
    from plasticlm.scol.matrix import AccuracyMatrix
    from plasticlm.scol.stream import consolidate_stream

    cfg = _config(args)
    _check_policy(args.policy)
    _, tok = load_model(cfg)
    policy = float32_master(load_causal_lm(args.policy, dtype="float32")[0])
    contexts = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")))
    _, stream = split_streams(contexts, cfg.train_streams, cfg.stream_length, cfg.eval_length,
                              cfg.seed)
    mat = AccuracyMatrix(stream)
    model, records, _ = consolidate_stream(
        policy, tok, stream, cfg.scol, "greedy",
        on_commit=lambda t, m: mat.add_row(m, tok, t), progress=not args.no_progress,
        replay=replay_pool(cfg, tok))
    out = prepare_output(args.out, "run", hint="give another --out")
    summary = mat.summary()
    summary["layers"] = [list(r.layers) for r in records]
    (out / "report.json").write_text(json.dumps(summary, indent=1) + "\n")
    model.save_pretrained(out / "consolidated")
    tok.save_pretrained(out / "consolidated")
    print(json.dumps({k: summary[k] for k in ("em", "f1", "layers")}))
    return 0


def _experiment(args) -> int:
    from pathlib import Path

    from plasticlm.experiments.scol.experiment import run_squad
    from plasticlm.experiments.scol.fisher import run_fisher
    from plasticlm.experiments.scol.longbench import run_longbench

    cfg = _config(args)
    if args.policy and args.which != "fisher":
        raise PlasticError(f"--policy is for 'fisher' only, not {args.which!r}")
    if args.sweep and args.which != "sweep":
        raise PlasticError(f"--sweep is for 'sweep' only, not {args.which!r}")
    if args.policy:
        _check_policy(args.policy)
    if args.which == "sweep":
        from plasticlm.config import load_config
        from plasticlm.experiments.scol.calibrate import SweepConfig

        grid = load_config(SweepConfig, None, args.sweep)
    quick = "-quick" if getattr(args, "quick", False) else ""
    out = prepare_output(args.out or f"runs/scol-{args.which}{quick}", "experiment",
                         hint="give another --out")
    progress = not args.no_progress
    if args.which == "squad":
        report = run_squad(cfg, out, progress=progress)
        shown = (Path(out) / "report.md").read_text() + f"\nseconds: {report['seconds']}"
    elif args.which == "sweep":
        from plasticlm.experiments.scol.calibrate import run_sweep

        report = run_sweep(cfg, grid, out, progress=progress)
        shown = (Path(out) / "sweep.md").read_text()
    elif args.which == "gate":
        from plasticlm.experiments.scol.calibrate import oracle_gate

        oracle_gate(cfg, out, max_layers=cfg.scol.max_layers, progress=progress)
        shown = (Path(out) / "gate.md").read_text()
    elif args.which == "oracle":
        from plasticlm.experiments.scol.oracle import run_oracle

        run_oracle(cfg, out, progress=progress)
        shown = (Path(out) / "oracle.md").read_text()
    elif args.which == "policy":
        from plasticlm.experiments.scol.policy_experiment import run_policy

        run_policy(cfg, out, progress=progress)
        shown = (Path(out) / "policy.md").read_text()
    elif args.which == "fisher":
        report = run_fisher(cfg, out, args.policy, progress=progress)
        shown = json.dumps({k: report[k] for k in ("recall_selected", "recall_random",
                                                   "layer_histogram", "mean_fisher")})
    else:
        run_longbench(cfg, out, progress=progress)
        shown = (Path(out) / "longbench.md").read_text()
    if getattr(args, "quick", False):   # the smoke preset's sizes: no result to read
        print(SMOKE_LINE)
    print(shown)
    print(f"report: {write_report(out)[0]}")
    return 0
