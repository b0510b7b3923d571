"""Run a federated experiment on Flower's simulation runtime, as Flower runs it (a SuperLink
in simulation mode, the plasticlm app submitted with ``flwr run``), with resume, progress,
report and plots."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import torch

from plasticlm.config import read_saved_config, save_config
from plasticlm.env import DEVICE_ENV, DTYPE_ENV, THREADS_ENV
from plasticlm.errors import PlasticError, Stopped
from plasticlm.fednl.build import build_model, tasks_for
from plasticlm.fednl.config import FedNLConfig, app_config
from plasticlm.fednl.deploy.simulation import end_shared_link, running_link, shared_link
from plasticlm.fednl.flower.checkpoint import Checkpointer
from plasticlm.fednl.flower.stopping import DONE_FILE, ERROR_FILE, StopRequest
from plasticlm.fednl.flower.strategy import progress_line
from plasticlm.fednl.registries import FEDERATED_METHODS
from plasticlm.fednl.report import plot_run, summarise
from plasticlm.fednl.theta import set_theta
from plasticlm.models import check_model_source
from plasticlm.models.specs import resolve_model
from plasticlm.outputs import check_output, prepare_output
from plasticlm.run_lock import RunLock, refuse_if_locked
from plasticlm.runs import clear_run_folder
from plasticlm.runtime import dtype_name, pick_device, pick_dtype
from plasticlm.tensor_files import load_tensors

# Each simulated client gets one Ray CPU and, by the thread policy (plasticlm.runtime.set_threads),
# one torch thread: the clients share the machine's cores.
CLIENT_CPUS = 1
log = logging.getLogger("plasticlm.fednl")
# How long a stop waits for the server to leave (it finishes a round it is committing).
STOP_WAIT_SECONDS = 10.0
POLL_SECONDS = 0.25


class Signalled(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread while it waits for the run."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _OnSignal:
    """SIGINT and SIGTERM stop the run: the server is asked to stop (its stop file) and
    :class:`Signalled` unwinds the wait for it; a second signal ends every process of the run
    and this one at once (the checkpoint's writes are atomic)."""

    def __init__(self, stop: StopRequest):
        self.stop, self.previous, self.signum = stop, {}, 0

    def __enter__(self) -> _OnSignal:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self.previous[s] = signal.signal(s, self.handler)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)
        self.previous = {}

    def handler(self, signum, frame) -> None:
        if self.signum:
            end_shared_link()
            os._exit(128 + signum)
        self.signum = signum
        self.stop.set(signum)
        raise Signalled(signum)


def _stopped(cfg: FedNLConfig, run_dir: Path, signum: int, proc) -> Stopped:
    """End the clients, give the server a few seconds to leave, end every process of the
    run, then say where the run stands."""
    link = running_link()
    if link is not None:
        for p in link.client_processes():   # their pending results fail at once
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - gone already
                pass
    deadline = time.time() + STOP_WAIT_SECONDS
    while proc is not None and proc.poll() is None and not (run_dir / DONE_FILE).exists():
        if time.time() > deadline:
            log.warning("the server did not stop within %.0fs", STOP_WAIT_SECONDS)
            break
        time.sleep(0.05)
    end_shared_link()
    done = Checkpointer(run_dir, cfg).committed_round()
    where = f"after round {done} of {cfg.train.rounds} (its checkpoint in {run_dir} is intact)" \
        if done else f"before round 1 was committed ({run_dir})"
    name = signal.Signals(signum).name
    return Stopped(f"stopped by {name} {where}; rerun with --resume to continue", signum)


def run_federated(cfg: FedNLConfig, resume: bool = False, backend_cpus: int = 2) -> Path:
    """Run (or, with ``resume``, continue) ``cfg`` on the simulation runtime.

    Writes ``runs/<name>/``: config.json, metrics.jsonl (one record per round with every
    client's local and federated accuracy), the last round's theta, the final theta as an
    adapter folder, summary.json and plots. Returns the run folder. SIGINT and SIGTERM stop
    it within seconds with :class:`Stopped`; the rounds committed so far stay.
    """
    # a live run's folder is neither cleared nor resumed: refused before anything else
    refuse_if_locked(Path(cfg.outputs.out) / cfg.name)
    # what the server and clients would fail on, refused before anything is written
    if not resume:   # a folder plasticlm did not write: refused before any model is built
        check_output(Path(cfg.outputs.out) / cfg.name, "choose another --set name=... or out=...")
    check_model_source(resolve_model(cfg.model))
    clients = len(tasks_for(cfg))
    if cfg.federation.min_clients > clients:
        raise PlasticError(f"config federation.min_clients={cfg.federation.min_clients} is more than the run's "
                           f"{clients} clients")
    run_dir = Path(cfg.outputs.out) / cfg.name
    if run_dir.exists() and not resume:
        if (run_dir / "checkpoint.json").exists():
            raise PlasticError(f"{run_dir} holds an earlier run; pass --resume to continue it, "
                               "or choose another --set name=...")
        clear_run_folder(run_dir, "choose another --set name=... or out=...")
    started = (run_dir / "checkpoint.json").exists() or any(run_dir.glob("round_*"))
    if resume and started and not (run_dir / "config.json").is_file():
        # without it nothing says the rounds were of this config: refused, never guessed
        raise PlasticError(f"{run_dir} holds rounds but no config.json: it cannot be resumed "
                           "as the run it was; restore its config.json, or start again with "
                           "another --set name=...")
    if resume and (run_dir / "config.json").exists() and \
            read_saved_config(FedNLConfig, run_dir) != cfg:
        raise PlasticError(f"{run_dir} was started with another config; resume with the same "
                           "config (see its config.json, or `--config` it)")
    prepare_output(run_dir, "run", hint="choose another --set name=... or out=...")
    with RunLock(run_dir):
        return _run_locked(cfg, run_dir, backend_cpus)


def _run_locked(cfg: FedNLConfig, run_dir: Path, backend_cpus: int) -> Path:
    """The run in its folder, which this process holds (:class:`RunLock`)."""
    save_config(cfg, run_dir)

    warning = cfg.gate_warning()
    if warning:
        log.warning(warning)
    stop = StopRequest(run_dir)
    stop.clear()
    proc = None
    try:
        with _OnSignal(stop):
            proc = _submit(cfg, run_dir, backend_cpus)
            _follow(cfg, run_dir, proc)
            done = Checkpointer(run_dir, cfg).committed_round()
            if done < cfg.train.rounds:
                raise PlasticError(f"the run stopped after round {done} of {cfg.train.rounds}: "
                                   f"{_why(run_dir)}; continue it with --resume")
            finish(cfg, run_dir)
    except Signalled as e:
        raise _stopped(cfg, run_dir, e.signum, proc) from None
    return run_dir


def _submit(cfg: FedNLConfig, run_dir: Path, backend_cpus: int):
    """Submit the run to this process's simulation SuperLink; the ``flwr run`` process."""
    n = len(tasks_for(cfg))
    device = pick_device()
    resources = client_resources(device, backend_cpus, cfg.federation.client_cpus)
    log.info("%s: %d rounds, %d clients on Flower's simulation runtime (%s, %s)", cfg.name,
             cfg.train.rounds, n, device, dtype_name(pick_dtype()))
    # the clients' environment: the thread policy, and the device and dtype of the command's
    # flags (runtime.runtime); Ray hands each client its GPU as cuda:0 of its own
    env = {THREADS_ENV: str(int(resources["num_cpus"])),
           DEVICE_ENV: "cuda" if resources["num_gpus"] else os.environ.get(DEVICE_ENV, ""),
           DTYPE_ENV: os.environ.get(DTYPE_ENV, "")}
    federation = {"num-supernodes": n, "client-resources-num-cpus": resources["num_cpus"],
                  "client-resources-num-gpus": resources["num_gpus"],
                  "init-args-num-cpus": backend_cpus,
                  "init-args-num-gpus": 1 if resources["num_gpus"] else 0,
                  "init-args-logging-level": "ERROR", "init-args-log-to-driver": False}
    (run_dir / ERROR_FILE).unlink(missing_ok=True)
    (run_dir / DONE_FILE).unlink(missing_ok=True)
    return shared_link(env).submit(app_config(cfg, run_dir), federation, run_dir / "flower.log")


def _follow(cfg: FedNLConfig, run_dir: Path, proc) -> None:
    """Wait for the run's server to leave (not for Flower and Ray to wind down), logging each
    round as it is committed."""
    ck = Checkpointer(run_dir, cfg)
    seen = len(ck.records())
    while True:
        ended = proc.poll() is not None or (run_dir / DONE_FILE).exists()
        records = ck.records()
        for rec in records[seen:]:
            log.info(progress_line(rec, cfg))
        seen = max(seen, len(records))
        if ended:
            return
        time.sleep(POLL_SECONDS)


def _why(run_dir: Path) -> str:
    """The server's own reason, or the last line of the run's Flower log."""
    error = run_dir / ERROR_FILE
    if error.exists():
        return error.read_text().strip()
    logfile = run_dir / "flower.log"
    lines = [x.strip() for x in logfile.read_text(errors="replace").splitlines() if x.strip()] \
        if logfile.exists() else []
    return f"{lines[-1][:300] if lines else 'no reason given'} (the whole log: {logfile})"


def client_resources(device: torch.device, backend_cpus: int,
                     client_cpus: int = CLIENT_CPUS) -> dict[str, float]:
    """Ray resources of one simulated client process: ``client_cpus`` CPUs (at most the
    backend's) and, when the models run on CUDA, a share of a GPU such that the client
    processes running at once fit on one GPU; no GPU otherwise (Ray schedules no MPS).

    Each client process holds one frozen base model that every client it runs shares, so
    ``client_cpus = backend_cpus`` (one process, clients in turn) holds one copy in all."""
    cpus = max(1, min(client_cpus, backend_cpus))
    gpus = 1.0 / max(1, backend_cpus // cpus) if device.type == "cuda" else 0.0
    return {"num_cpus": cpus, "num_gpus": gpus}


def finish(cfg: FedNLConfig, run_dir: Path) -> dict:
    """Final theta as an adapter folder, summary.json and plots."""
    ck = Checkpointer(run_dir, cfg)
    theta = load_tensors(run_dir / f"round_{ck.committed_round():04d}" / "theta.safetensors",
                         "FedNL theta")
    model, tokenizer = build_model(cfg)
    set_theta(model, theta)
    final = run_dir / "final"
    FEDERATED_METHODS[cfg.method.name]().save(model, tokenizer, final)
    summary = summarise(cfg, ck.records(), theta)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_run(ck.records(), run_dir)
    return summary
