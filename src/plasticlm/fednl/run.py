"""Run a federated experiment on Flower's simulation runtime, with resume, report and plots."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch
from flwr.simulation import run_simulation

from plasticlm.errors import PlasticError
from plasticlm.fednl.checkpoint import Checkpointer
from plasticlm.fednl.client_app import client_app
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.methods import METHODS, check_method, gate_check
from plasticlm.fednl.report import plot_run, summarise
from plasticlm.fednl.server_app import make_server_app
from plasticlm.fednl.setup import build_model, initial_theta, tasks_for
from plasticlm.fednl.theta import set_theta
from plasticlm.runs import (
    DEVICE_ENV,
    THREADS_ENV,
    dtype_name,
    load_tensors,
    pick_device,
    pick_dtype,
)

log = logging.getLogger("plasticlm.fednl")

# Each simulated client gets one Ray CPU and, by the thread policy (plasticlm.runs.set_threads),
# one torch thread: the clients share the machine's cores.
CLIENT_CPUS = 1


def _quiet_flower() -> None:
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    for name in ("flwr", "ray"):
        logging.getLogger(name).setLevel(logging.WARNING)


def run_federated(cfg: FedNLConfig, resume: bool = False, backend_cpus: int = 2) -> Path:
    """Run (or, with ``resume``, continue) ``cfg`` on the simulation runtime.

    Writes ``runs/<name>/``: config.json, metrics.jsonl (one record per round with every
    client's local and federated accuracy), the last round's theta, the final theta as an
    adapter folder, summary.json and plots. Returns the run folder.
    """
    check_method(cfg.method.name)
    if cfg.local_eval not in ("every", "last"):
        raise PlasticError(f"local_eval must be 'every' or 'last', not {cfg.local_eval!r}")
    run_dir = Path(cfg.out) / cfg.name
    if run_dir.exists() and not resume:
        if (run_dir / "checkpoint.json").exists():
            raise PlasticError(f"{run_dir} holds an earlier run; pass --resume to continue it, "
                               "or choose another --set name=...")
        shutil.rmtree(run_dir)
    if resume and (run_dir / "config.json").exists():
        saved = FedNLConfig.from_json(json.dumps(json.loads((run_dir / "config.json").read_text())))
        if saved.to_json() != cfg.to_json():
            raise PlasticError(f"{run_dir} was started with another config; resume with the same "
                               "config (see its config.json)")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(json.loads(cfg.to_json()), indent=2) + "\n")

    warning = gate_check(cfg.method, cfg.rounds)
    if warning:
        log.warning(warning)
    n = len(tasks_for(cfg))  # also makes sure data (and sandbox models) exist before Ray starts
    initial = initial_theta(cfg)
    _quiet_flower()
    # Ray's worker processes inherit the environment: the ClientApp calls set_threads(), and
    # its models load on the device and in the dtype of runs.runtime (the command's flags).
    resources = client_resources(pick_device(), backend_cpus)
    env = {THREADS_ENV: str(CLIENT_CPUS)}
    if resources["num_gpus"]:  # Ray hands each client its GPU as cuda:0 of its own
        env[DEVICE_ENV] = "cuda"
    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    log.info("%s: %d rounds, %d clients on Flower's simulation runtime (%s, %s)", cfg.name,
             cfg.rounds, n, pick_device(), dtype_name(pick_dtype()))
    try:
        run_simulation(
            server_app=make_server_app(cfg, run_dir, initial),
            client_app=client_app,
            num_supernodes=n,
            backend_config={"client_resources": resources,
                            "init_args": {"num_cpus": backend_cpus, "include_dashboard": False,
                                          "log_to_driver": False, "logging_level": "ERROR"}},
        )
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    done = Checkpointer(run_dir, cfg).committed_round()
    if done < cfg.rounds:
        raise PlasticError(f"the run stopped after round {done} of {cfg.rounds} (see the log "
                           f"above); continue it with --resume")
    finish(cfg, run_dir)
    return run_dir


def client_resources(device: torch.device, backend_cpus: int) -> dict[str, float]:
    """Ray resources of one simulated client: one CPU and, when the models run on CUDA, a
    share of a GPU such that the clients running at once (one per backend CPU) fit on one
    GPU; no GPU otherwise (Ray schedules no MPS)."""
    gpus = 1.0 / max(1, backend_cpus // CLIENT_CPUS) if device.type == "cuda" else 0.0
    return {"num_cpus": CLIENT_CPUS, "num_gpus": gpus}


def finish(cfg: FedNLConfig, run_dir: Path) -> dict:
    """Final theta as an adapter folder, summary.json and plots."""
    ck = Checkpointer(run_dir, cfg)
    theta = load_tensors(run_dir / f"round_{ck.committed_round():04d}" / "theta.safetensors",
                         "FedNL theta")
    model, tokenizer = build_model(cfg)
    set_theta(model, theta)
    final = run_dir / "final"
    METHODS[cfg.method.name].save(model, tokenizer, final)
    summary = summarise(cfg, ck.records(), theta)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_run(ck.records(), run_dir)
    return summary
