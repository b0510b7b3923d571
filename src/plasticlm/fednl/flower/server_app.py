"""The FedNL ServerApp (Flower Message API), the entry point of ``flwr run`` for the
simulation and a deployment alike: waits for the nodes, then runs the remaining rounds of the
run's strategy (:mod:`plasticlm.fednl.flower.strategy`) from its last checkpoint."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from plasticlm.config import save_config
from plasticlm.errors import PlasticError
from plasticlm.fednl.build import initial_theta, tasks_for
from plasticlm.fednl.config import FedNLConfig, run_of
from plasticlm.fednl.flower.checkpoint import Checkpointer
from plasticlm.fednl.flower.privacy_server import run_rounds
from plasticlm.fednl.flower.stopping import (
    DONE_FILE,
    ERROR_FILE,
    RunStopped,
    StoppableGrid,
    StopRequest,
)
from plasticlm.fednl.flower.strategy import RoundFailed, ThetaAverage
from plasticlm.runs import write_text_atomic

log = logging.getLogger("plasticlm.fednl")


def server_main(grid: Grid, cfg: FedNLConfig, run_dir: str | Path,
                initial: dict[str, torch.Tensor]) -> None:
    """Run the remaining rounds of ``cfg`` from the run folder's last checkpoint (if any)."""
    checkpointer = Checkpointer(Path(run_dir), cfg)
    start_round, theta = checkpointer.latest(initial)
    if start_round >= cfg.train.rounds:
        log.info("run already finished (%d rounds)", start_round)
        return
    num_nodes = len(tasks_for(cfg))
    strategy = ThetaAverage(cfg, checkpointer, start_round, num_nodes)
    strategy.server_state = checkpointer.server_state(start_round)
    _wait_for_nodes(grid, num_nodes, cfg.federation.min_clients)
    # plain FedNL, or under the run's privacy settings (Flower's DP wrappers, SecAgg+)
    run_rounds(grid, strategy, theta, cfg.train.rounds - start_round, cfg, num_nodes)


def _wait_for_nodes(grid: Grid, wanted: int, minimum: int, seconds: float = 120.0) -> None:
    deadline = time.time() + seconds
    while len(list(grid.get_node_ids())) < wanted and time.time() < deadline:
        time.sleep(0.5)
    have = len(list(grid.get_node_ids()))
    if have < minimum:
        raise RoundFailed(f"only {have} client node(s) connected within {seconds:.0f}s; "
                          f"the run needs at least min_clients={minimum}")


# The entry point of `flwr run` (the simulation's and a deployment's): Flower's run config is
# FedNLConfig's keys, dotted (the app's [tool.flwr.app.config]), and the run folder.
server_app = ServerApp()


@server_app.main()
def deployed_main(grid: Grid, context: Context) -> None:
    cfg, run_dir = run_of(context)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir)
    (run_dir / ERROR_FILE).unlink(missing_ok=True)
    (run_dir / DONE_FILE).unlink(missing_ok=True)
    stop = StopRequest(run_dir)
    try:
        server_main(StoppableGrid(grid, stop), cfg, run_dir, initial_theta(cfg))
    except RunStopped as e:
        log.info("server stopped: %s", e)
    except Exception as e:
        why = str(e) if isinstance(e, (PlasticError, RoundFailed)) else f"{type(e).__name__}: {e}"
        write_text_atomic(run_dir / ERROR_FILE, " ".join(why.split())[:2000] + "\n")
        raise
    finally:
        write_text_atomic(run_dir / DONE_FILE, f"{time.time()}\n")
