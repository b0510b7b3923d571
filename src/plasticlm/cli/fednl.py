"""``plasticlm fednl``: federated training of memory rules (and the baselines) on Flower."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from plasticlm.cli.options import (
    add_config_options,
    add_runtime_options,
    load_from_args,
    non_empty,
)
from plasticlm.run_report import write_report

log = logging.getLogger("plasticlm.fednl")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fednl", help="federated nested learning on Flower (and its baselines)",
                       description="Federated training of theta on non-IID clients with Flower: "
                       "fednl (memory rules) or the baselines fedavg, fedprox, fedala, fedssi, "
                       "fedavg-full. Runs on Flower's simulation runtime on this machine.")
    fsub = p.add_subparsers(dest="fednl_command", required=True, metavar="ACTION")

    q = fsub.add_parser("run", help="run one method (simulation runtime)",
                        description="Run one federated experiment; writes runs/<name>/ with "
                        "metrics.jsonl, per-round checkpoints, final theta, summary and plots.")
    _config_args(q)
    q.add_argument("--resume", action="store_true",
                   help="continue the run folder's last committed round")
    q.set_defaults(func=_run)

    q = fsub.add_parser("compare", help="run several methods on the same clients and tabulate",
                        description="Run each method with the same config and seed, then print "
                        "the table: mean accuracy, aggregation drop per domain, MB per round.")
    _config_args(q)
    q.add_argument("--methods", default="fednl,fedavg,fedprox,fedala,fedssi,fedavg-full",
                   help="comma-separated methods")
    q.set_defaults(func=_compare)

    q = fsub.add_parser("experiment", help="the paper's experiments with controls, over seeds",
                        description="Run one of the FedNL paper's experiments on Flower over "
                        "seeds, with its controls (windowed and full-attention FedAvg, the "
                        "memory with its recurrence removed, the untrained model), and write "
                        "results.json, table.md and a plot under runs/fednl-experiments/NAME. "
                        "A re-run continues from the finished (variant, seed) pairs.")
    q.add_argument("name", choices=(*EXPERIMENT_NAMES, "all"),
                   help="mmlu | niah | openbook | stream | memory | comm | all")
    add_config_options(q, "plasticlm.experiments.fednl.variants:ExperimentConfig",
                       quick="fednl/experiment-quick")
    add_runtime_options(q)
    q.add_argument("--table-only", action="store_true",
                   help="print the table of the seeds finished so far; run nothing")
    q.set_defaults(func=_experiment)

    q = fsub.add_parser("submit", help="flwr run --stream of the Flower app; exits 1 when the "
                        "run fails",
                        description="`flwr run APP SUPERLINK --stream` that exits as the run "
                        "ended: 0 when Flower reports it finished:completed, 1 (with one line "
                        "naming the status) when it failed or was stopped, 2 when Flower "
                        "refused to start it. flwr 1.42's own `flwr run --stream` exits 0 in "
                        "every case; the status is the one `flwr ls --run-id N` reports.")
    q.add_argument("superlink", type=non_empty, help="the SuperLink connection's name in "
                   "$FLWR_HOME/config.toml, as `flwr run` takes it")
    q.add_argument("--app", type=non_empty, default=None, metavar="DIR",
                   help="the Flower app folder (default: plasticlm's FedNL app)")
    q.add_argument("--run-config", action="append", default=[], metavar="CONFIG",
                   type=non_empty,
                   help="as `flwr run`'s: a TOML file or 'key=value ...' (repeatable)")
    q.add_argument("--federation-config", action="append", default=[], metavar="CONFIG",
                   type=non_empty,
                   help="as `flwr run`'s, e.g. 'num-supernodes=5' (repeatable)")
    q.add_argument("--operator-secret-file", type=non_empty, default=None, metavar="FILE",
                   help="the SuperLink's operator secret (0600), sent with every flwr call: "
                        "to operate it as another user or from another machine")
    q.set_defaults(func=_submit)


def _config_args(q: argparse.ArgumentParser) -> None:
    add_config_options(q, "plasticlm.fednl.config:FedNLConfig", quick="fednl/quick")
    add_runtime_options(q)


EXPERIMENT_NAMES = ("mmlu", "niah", "openbook", "stream", "memory", "comm")


def _load(args):
    from plasticlm.fednl.config import FedNLConfig

    return load_from_args(FedNLConfig, args)


def _run(args) -> int:
    from plasticlm.fednl.run import run_federated

    cfg = _load(args)
    run_dir = run_federated(cfg, resume=args.resume)
    summary = json.loads((run_dir / "summary.json").read_text())
    from plasticlm.fednl.report import comparison_table

    print(comparison_table([summary]))
    print(f"run folder: {run_dir}")
    return 0


def _compare(args) -> int:
    from plasticlm.config import override
    from plasticlm.errors import PlasticError
    from plasticlm.fednl.registries import FEDERATED_METHODS
    from plasticlm.fednl.report import comparison_table
    from plasticlm.fednl.run import run_federated

    base = _load(args)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not names:
        raise PlasticError("--methods names no method; e.g. --methods fednl,fedavg")
    for name in names:
        FEDERATED_METHODS.check(name)
    summaries = []
    for name in names:
        cfg = override(base, {"name": f"{base.name}-{name}", "method.name": name})
        log.info("compare: method %s", name)
        run_dir = run_federated(cfg)
        summaries.append(json.loads((run_dir / "summary.json").read_text()))
    table = comparison_table(summaries)
    print(table)
    from pathlib import Path

    out = Path(base.outputs.out) / f"{base.name}-comparison.md"
    out.write_text(table + "\n")
    print(f"table: {out}")
    return 0


def _experiment(args) -> int:
    from plasticlm.experiments.fednl.experiment import run_experiment, table_of_finished
    from plasticlm.experiments.fednl.variants import ExperimentConfig

    names = EXPERIMENT_NAMES if args.name == "all" else (args.name,)
    for name in names:
        cfg = load_from_args(ExperimentConfig, args, [f"experiment={name}"])
        print(f"== fednl experiment {name} ==", flush=True)
        if args.table_only:
            print(table_of_finished(cfg))
            continue
        print(run_experiment(cfg)["table"], flush=True)
        print(f"results: {cfg.out}/{name}/; report: {write_report(Path(cfg.out) / name)[0]}",
              flush=True)
    return 0


def _submit(args) -> int:
    import signal
    import sys

    from plasticlm.errors import Stopped
    from plasticlm.fednl.deploy.processes import APP_DIR
    from plasticlm.fednl.deploy.submit import submit

    try:
        outcome = submit(args.superlink, args.app or APP_DIR, args.run_config,
                         args.federation_config, args.operator_secret_file)
    except KeyboardInterrupt:
        raise Stopped("interrupted; the run goes on on the SuperLink (`flwr ls`, `flwr stop "
                      f"RUN_ID {args.superlink}`)", signal.SIGINT) from None
    if outcome.completed:
        return 0
    details = f" ({outcome.details})" if outcome.details else ""
    print(f"plasticlm: error: run {outcome.run_id} ended {outcome.status}{details}; its log: "
          f"flwr log {outcome.run_id} {args.superlink} --show", file=sys.stderr)
    return 1
