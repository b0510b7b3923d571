"""A FedNL federation run in one process for end-to-end tests: the real ServerApp rounds
(Flower's ``FedAvg.start`` driving :class:`ThetaAverage`) and the real ClientApp, with what
travelled recorded per (round, partition)."""

import dataclasses

import pytest
import torch
from flwr.app import MessageType
from safetensors.torch import load_file

from plasticlm.config import from_dict
from plasticlm.fednl import build, local_round
from plasticlm.fednl.config import RUN_DIR_KEY, FedNLConfig, flower_run_config
from plasticlm.fednl.flower.client_app import client_app
from plasticlm.fednl.flower.in_process_grid import InProcessGrid
from plasticlm.fednl.flower.messages import unpack_theta
from plasticlm.fednl.flower.server_app import server_main


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


def federate(tmp_path_factory, config: dict, counts: tuple[int, ...], run_dir=None):
    """The run of ``config`` (in ``run_dir``, resuming what it holds; default a fresh
    folder), client i trained on the first ``counts[i]`` examples of its data; (run folder,
    grid, the theta each client trained from by key, the clients' tasks)."""
    mp = pytest.MonkeyPatch()
    cfg = from_dict(FedNLConfig, config)
    full = build.tasks_for(cfg)
    assert all(len(t.pairs()) >= n for t, n in zip(full, counts, strict=True))
    tasks = tuple(dataclasses.replace(t, train=t.train[:n])
                  for t, n in zip(full, counts, strict=True))
    # every node of the run sees these clients (tasks_for reads build._tasks)
    mp.setattr(build, "_tasks", lambda cfg_json: tasks)
    starts: list[dict] = []
    real_set_theta = local_round.set_theta

    def set_start(model, theta):   # local_update's only set_theta: the round's starting theta
        starts.append({k: v.detach().float().cpu().clone() for k, v in theta.items()})
        real_set_theta(model, theta)

    mp.setattr(local_round, "set_theta", set_start)
    run_dir = run_dir or tmp_path_factory.mktemp(cfg.name) / "run"
    run_config = {**flower_run_config(cfg), RUN_DIR_KEY: str(run_dir)}
    try:
        with RecordingGrid(client_app, run_config, len(tasks)) as grid:
            server_main(grid, cfg, run_dir, build.initial_theta(cfg))
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
