"""Run a federated experiment on Flower's simulation runtime, with resume, report and plots."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

import ray
import torch
from flwr.simulation import run_simulation
from ray._private import state as ray_state  # the actor table; ray is pinned by flwr

from plasticlm.errors import PlasticError, Stopped
from plasticlm.fednl.checkpoint import Checkpointer
from plasticlm.fednl.client_app import client_app
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.methods import METHODS, check_method, gate_check
from plasticlm.fednl.report import plot_run, summarise
from plasticlm.fednl.server_app import StopRequest, make_server_app
from plasticlm.fednl.setup import build_model, initial_theta, tasks_for
from plasticlm.fednl.theta import set_theta
from plasticlm.runs import (
    DEVICE_ENV,
    THREADS_ENV,
    dtype_name,
    environment,
    load_tensors,
    pick_device,
    pick_dtype,
)

# Each simulated client gets one Ray CPU and, by the thread policy (plasticlm.runs.set_threads),
# one torch thread: the clients share the machine's cores.
CLIENT_CPUS = 1
log = logging.getLogger("plasticlm.fednl")
# How long a stop waits for the server to finish a round it is committing.
STOP_WAIT_SECONDS = 30.0


def _quiet_flower() -> None:
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    for name in ("flwr", "ray"):
        logging.getLogger(name).setLevel(logging.WARNING)


class Signalled(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread when Flower does not hold it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _OnSignal:
    """SIGINT and SIGTERM stop the run; a second signal ends the process without waiting
    (the checkpoint's writes are atomic).

    While Flower runs the simulation, the main thread is left alone: unwinding it would shut
    Ray down under a client's pending result, a wait that never ends. Instead the clients'
    processes are ended (their pending results fail at once), the server leaves at its next
    poll for replies, and Flower winds down by itself. ``ray.init`` puts its own SIGTERM
    handler in (an immediate exit): :meth:`install` again after it.
    """

    def __init__(self, stop: StopRequest):
        self.stop, self.previous, self.in_flower = stop, {}, False

    def __enter__(self) -> _OnSignal:
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)
        self.previous = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self.previous.setdefault(s, signal.signal(s, self.handler))

    def handler(self, signum, frame) -> None:
        if self.stop.is_set():
            os._exit(128 + signum)
        self.stop.set(signum)
        # the clients' errors from here on are the stop's own doing, not news
        for name in ("flwr", "ray"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        if not self.in_flower:
            raise Signalled(signum)
        _end_clients()


def _end_clients() -> None:
    """Kill the simulation's client processes (Ray actors); their pending results fail."""
    try:
        actors = ray_state.actors().values()
    except Exception as e:  # noqa: BLE001 - the stop goes on; the clients finish their job
        log.warning("could not list the clients to stop them: %s", e)
        return
    for actor in actors:
        if actor.get("State") == "ALIVE" and actor.get("Pid"):
            try:
                os.kill(int(actor["Pid"]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _start_ray(init_args: dict, on_signal: _OnSignal) -> None:
    """Ray started here rather than by Flower (which uses a running Ray), so that the run's
    signal handlers go back in after ``ray.init``. The workers get this process's sys.path,
    as Flower gives them."""
    try:
        ray.init(runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}},
                 **init_args)
    except SystemExit as e:   # Ray's SIGTERM handler, while Ray was starting
        if e.code != signal.SIGTERM:
            raise
        on_signal.handler(signal.SIGTERM, None)
    on_signal.install()


def _stopped(cfg: FedNLConfig, run_dir: Path, stop: StopRequest) -> Stopped:
    """Wait for the server to leave (Ray is down by now), then say where the run stands."""
    if not stop.wait_served(STOP_WAIT_SECONDS):
        log.warning("the server did not stop within %.0fs", STOP_WAIT_SECONDS)
    done = Checkpointer(run_dir, cfg).committed_round()
    where = f"after round {done} of {cfg.rounds} (its checkpoint in {run_dir} is intact)" \
        if done else f"before round 1 was committed ({run_dir})"
    name = signal.Signals(stop.signum).name
    return Stopped(f"stopped by {name} {where}; rerun with --resume to continue", stop.signum)


def run_federated(cfg: FedNLConfig, resume: bool = False, backend_cpus: int = 2) -> Path:
    """Run (or, with ``resume``, continue) ``cfg`` on the simulation runtime.

    Writes ``runs/<name>/``: config.json, metrics.jsonl (one record per round with every
    client's local and federated accuracy), the last round's theta, the final theta as an
    adapter folder, summary.json and plots. Returns the run folder. SIGINT and SIGTERM stop
    it within seconds with :class:`Stopped`; the rounds committed so far stay.
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
    stop = StopRequest()
    try:
        with _OnSignal(stop) as on_signal:
            _simulate(cfg, run_dir, stop, on_signal, backend_cpus)
            if stop.is_set():   # Flower has wound down after a signal
                raise Signalled(stop.signum)
            done = Checkpointer(run_dir, cfg).committed_round()
            if done < cfg.rounds:
                raise PlasticError(f"the run stopped after round {done} of {cfg.rounds} (see "
                                   "the log above); continue it with --resume")
            finish(cfg, run_dir)
    except Signalled:
        raise _stopped(cfg, run_dir, stop) from None
    return run_dir


def _simulate(cfg: FedNLConfig, run_dir: Path, stop: StopRequest, on_signal: _OnSignal,
              backend_cpus: int) -> None:
    n = len(tasks_for(cfg))  # also makes sure data (and sandbox models) exist before Ray starts
    initial = initial_theta(cfg)
    _quiet_flower()
    # Ray's worker processes inherit the environment: the ClientApp calls set_threads(), and
    # its models load on the device and in the dtype of runs.runtime (the command's flags).
    resources = client_resources(pick_device(), backend_cpus)
    env = {THREADS_ENV: str(CLIENT_CPUS)}
    if resources["num_gpus"]:  # Ray hands each client its GPU as cuda:0 of its own
        env[DEVICE_ENV] = "cuda"
    log.info("%s: %d rounds, %d clients on Flower's simulation runtime (%s, %s)", cfg.name,
             cfg.rounds, n, pick_device(), dtype_name(pick_dtype()))
    init_args = {"num_cpus": backend_cpus, "include_dashboard": False, "log_to_driver": False,
                 "logging_level": "ERROR"}
    with environment(**env):
        try:
            _start_ray(init_args, on_signal)
            on_signal.in_flower = True
            run_simulation(
                server_app=make_server_app(cfg, run_dir, initial, stop),
                client_app=client_app,
                num_supernodes=n,
                backend_config={"client_resources": resources, "init_args": init_args},
            )
        finally:
            on_signal.in_flower = False
            if ray.is_initialized():   # Flower shuts Ray down, unless it failed earlier
                ray.shutdown()


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
