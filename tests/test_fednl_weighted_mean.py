"""Federation end to end (issue 41, item 4): two clients that hold different data, 3 and 9
training examples, run 2 rounds through the real ServerApp rounds (Flower's ``FedAvg.start``
driving :class:`ThetaAverage`) and the real ClientApp (its mods included), in one process.

What the clients returned is read off the wire (each training reply, as the server got it);
what they trained from is read inside the client's local update (the theta set on the model
before its first step). The server's committed theta of each round must be the
example-weighted mean of its clients' replies, and every client must start round 2 from the
server's round-1 aggregate: a server that stops sending the new average, or averages without
the example counts, fails here."""

import dataclasses

import pytest
import torch
from flwr.app import MessageType
from safetensors.torch import load_file

from plasticlm.config import from_dict
from plasticlm.fednl import local, setup
from plasticlm.fednl.client_app import client_app
from plasticlm.fednl.config import RUN_DIR_KEY, FedNLConfig, flower_run_config
from plasticlm.fednl.inprocess import InProcessGrid
from plasticlm.fednl.messages import unpack_theta
from plasticlm.fednl.server_app import server_main

pytestmark = pytest.mark.usefixtures("one_thread")

COUNTS = (3, 9)   # training examples of client 0 and client 1
ROUNDS = 2
ATOL = 1e-5       # float32 arithmetic on values of order 1

CONFIG = {"name": "weighted", "model": "sandbox-quick:receiver",
          "data": {"source": "sandbox-quick", "split": "dirichlet", "num_clients": 2,
                   "max_train": max(COUNTS), "max_test": 2},
          "train": {"rounds": ROUNDS, "local_steps": 3, "batch_size": 2},
          "eval": {"local_eval": "last"},
          # the plain example-weighted mean: no clipping to bend it
          "aggregation": {"rule": "mean", "clip": 0.0}}


class RecordingGrid(InProcessGrid):
    """The in-process grid, keeping each training round's theta per partition: what the
    server sent and what the client replied (both as they travelled)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent: dict[tuple[int, int], dict] = {}
        self.returned: dict[tuple[int, int], dict] = {}
        self.order: list[tuple[int, int]] = []   # the training messages, in delivery order

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            (reply,) = super().send_and_receive([msg], timeout=timeout)
            if msg.metadata.message_type == MessageType.TRAIN:
                pid = int(self.contexts[msg.metadata.dst_node_id].node_config["partition-id"])
                key = (int(msg.content["config"]["server-round"]), pid)
                assert not reply.has_error(), reply.error.reason
                self.order.append(key)
                self.sent[key] = unpack_theta(msg.content["arrays"])
                self.returned[key] = unpack_theta(reply.content["arrays"])
            replies.append(reply)
        return replies


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The two-round run; (run folder, grid, the theta each client trained from by key,
    the clients' tasks)."""
    mp = pytest.MonkeyPatch()
    cfg = from_dict(FedNLConfig, CONFIG)
    full = setup.tasks_for(cfg)
    assert all(len(t.pairs()) >= n for t, n in zip(full, COUNTS, strict=True))
    tasks = tuple(dataclasses.replace(t, train=t.train[:n])
                  for t, n in zip(full, COUNTS, strict=True))
    # every node of the run sees these clients (tasks_for reads setup._tasks)
    mp.setattr(setup, "_tasks", lambda cfg_json: tasks)
    starts: list[dict] = []
    real_set_theta = local.set_theta

    def set_start(model, theta):   # local_update's only set_theta: the round's starting theta
        starts.append({k: v.detach().float().cpu().clone() for k, v in theta.items()})
        real_set_theta(model, theta)

    mp.setattr(local, "set_theta", set_start)
    run_dir = tmp_path_factory.mktemp("weighted") / "run"
    run_config = {**flower_run_config(cfg), RUN_DIR_KEY: str(run_dir)}
    try:
        with RecordingGrid(client_app, run_config, len(tasks)) as grid:
            server_main(grid, cfg, run_dir, setup.initial_theta(cfg))
    finally:
        mp.undo()
    assert len(starts) == len(grid.order)
    return run_dir, grid, dict(zip(grid.order, starts, strict=True)), tasks


def committed(run_dir, rnd: int) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / f"round_{rnd:04d}" / "theta.safetensors"))


def mean(thetas: list[dict], weights: list[float]) -> dict[str, torch.Tensor]:
    total = sum(weights)
    return {k: sum(w * t[k].double() for t, w in zip(thetas, weights, strict=True)) / total
            for k in thetas[0]}


def distance(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def test_clients_hold_different_data_of_different_sizes(run):
    _, grid, _, tasks = run
    assert [len(t.pairs()) for t in tasks] == list(COUNTS)
    assert not {q.question for q in tasks[0].train} & {q.question for q in tasks[1].train}
    assert sorted(grid.returned) == [(r, p) for r in range(1, ROUNDS + 1) for p in (0, 1)]


@pytest.mark.parametrize("rnd", range(1, ROUNDS + 1))
def test_server_theta_is_the_example_weighted_mean_of_the_clients(run, rnd):
    run_dir, grid, _, _ = run
    returned = [grid.returned[rnd, pid] for pid in (0, 1)]
    weighted = mean(returned, [float(n) for n in COUNTS])
    unweighted = mean(returned, [1.0, 1.0])
    # the clients moved apart far enough that ignoring the counts shows
    assert distance(weighted, unweighted) > 50 * ATOL
    server = committed(run_dir, rnd)
    assert distance(server, weighted) < ATOL, \
        f"round {rnd}: the server's theta is not the 3:9 example-weighted mean of the replies"


def test_clients_start_each_round_from_the_servers_last_aggregate(run):
    run_dir, grid, starts, _ = run
    initial = grid.sent[1, 0]
    for pid in (0, 1):
        assert distance(starts[1, pid], initial) == 0.0
    aggregate = committed(run_dir, 1)
    assert distance(aggregate, initial) > 50 * ATOL    # round 1 moved theta
    for pid in (0, 1):
        assert distance(grid.sent[2, pid], aggregate) < ATOL, \
            f"client {pid}: the server did not send round 1's aggregate for round 2"
        assert distance(starts[2, pid], aggregate) < ATOL, \
            f"client {pid} did not start round 2 from round 1's aggregate"
