"""Server optimisers (issue 41's lever): FedAvgM, FedAdam and FedYogi against Flower's own
strategies on the same aggregates, and in a real two-client federation, where theta must take
the optimiser's step with its state carried across rounds and across a resume."""

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, MetricRecord
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, FedYogi
from inprocess_run import committed, distance, federate, mean
from test_fednl_weighted_mean import CONFIG, COUNTS

from plasticlm.config import from_dict
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.config_sections import AggregationConfig
from plasticlm.fednl.flower.checkpoint import Checkpointer
from plasticlm.fednl.registries import SERVER_OPTIMIZERS

pytestmark = pytest.mark.usefixtures("one_thread")

FLOWER = {"avgm": lambda c: FedAvgM(server_learning_rate=c.server_lr,
                                    server_momentum=c.server_momentum),
          "adam": lambda c: FedAdam(eta=c.server_lr, beta_1=c.server_momentum,
                                    beta_2=c.server_beta2, tau=c.server_tau),
          "yogi": lambda c: FedYogi(eta=c.server_lr, beta_1=c.server_momentum,
                                    beta_2=c.server_beta2, tau=c.server_tau)}


def flower_trajectory(name: str, cfg: AggregationConfig, start: np.ndarray,
                      aggregates: list[np.ndarray], monkeypatch) -> list[np.ndarray]:
    """Flower's strategy ``name`` fed ``aggregates`` as its rounds' FedAvg results."""
    strategy = FLOWER[name](cfg)
    queue = list(aggregates)
    monkeypatch.setattr(FedAvg, "aggregate_train", lambda self, rnd, replies: (
        ArrayRecord({"w": Array(queue.pop(0))}), MetricRecord({})))
    current, out = start, []
    for rnd in range(1, len(aggregates) + 1):
        record = ArrayRecord({"w": Array(current)})
        strategy.current_arrays = record if name == "avgm" else \
            {k: a.numpy() for k, a in record.items()}
        new, _ = strategy.aggregate_train(rnd, [])
        current = new["w"].numpy()
        out.append(current)
    return out


@pytest.mark.parametrize("name", sorted(FLOWER))
def test_each_optimiser_takes_flowers_steps(name, monkeypatch):
    cfg = AggregationConfig(server_opt=name, server_lr=0.3, server_momentum=0.8,
                            server_beta2=0.95, server_tau=1e-2)
    rng = np.random.default_rng(0)
    start = rng.normal(size=6).astype(np.float32)
    # the clients' mean each round, as FedAvg would return it from the current theta
    moves = [rng.normal(scale=0.1, size=6).astype(np.float32) for _ in range(3)]
    ours, state, theta, aggregates = [], {}, torch.tensor(start), []
    optimiser = SERVER_OPTIMIZERS[name](cfg)
    for rnd, move in enumerate(moves, 1):
        aggregates.append((theta + torch.tensor(move)).numpy())
        step, state = optimiser.propose(torch.tensor(move), state, rnd)
        theta = theta + step
        ours.append(theta.numpy())
    theirs = flower_trajectory(name, cfg, start, aggregates, monkeypatch)
    for rnd, (a, b) in enumerate(zip(ours, theirs, strict=True), 1):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"round {rnd}")


def test_every_registered_optimiser_is_checked_against_flower():
    assert set(SERVER_OPTIMIZERS.names()) == set(FLOWER) | {"none"}


def test_none_is_fedavg():
    delta = torch.randn(5)
    step, state = SERVER_OPTIMIZERS["none"](AggregationConfig()).propose(delta, {}, 1)
    assert torch.equal(step, delta) and state == {}


AVGM = {**CONFIG, "name": "avgm",
        "aggregation": {**CONFIG["aggregation"], "server_opt": "avgm", "server_lr": 0.5,
                        "server_momentum": 0.8}}


@pytest.fixture(scope="module")
def avgm_run(tmp_path_factory):
    return federate(tmp_path_factory, AVGM, COUNTS)


def test_server_theta_takes_the_momentum_step(avgm_run):
    """Round 1: theta1 = theta0 + lr d1; round 2: theta2 = theta1 + lr (mu d1 + d2), d the
    example-weighted mean of the replies minus what was sent."""
    run_dir, grid, _, _ = avgm_run
    lr, mu = 0.5, 0.8
    d = {}
    for rnd in (1, 2):
        sent = grid.sent[rnd, 0]
        avg = mean([grid.returned[rnd, pid] for pid in (0, 1)], [float(n) for n in COUNTS])
        d[rnd] = {k: avg[k] - sent[k].double() for k in sent}
    theta0, theta1 = grid.sent[1, 0], committed(run_dir, 1)
    assert distance(theta1, {k: theta0[k] + lr * d[1][k] for k in theta0}) < 1e-5
    expected = {k: theta1[k] + lr * (mu * d[1][k] + d[2][k]) for k in theta1}
    assert distance(committed(run_dir, 2), expected) < 1e-5
    # the momentum buffer is the round's state, checkpointed with its theta
    m2 = Checkpointer(run_dir, from_dict(FedNLConfig, AVGM)).server_state(2)["m"]
    assert m2.shape[0] == sum(v.numel() for v in theta1.values())


def test_a_resumed_run_continues_the_same_trajectory(avgm_run, tmp_path_factory):
    """One round, then a resume to two, ends where the two rounds in one go ended: the
    optimiser's state came back from the checkpoint."""
    run_dir, _, _, _ = avgm_run
    one = {**AVGM, "train": {**AVGM["train"], "rounds": 1}}
    resumed, _, _, _ = federate(tmp_path_factory, one, COUNTS)
    federate(tmp_path_factory, AVGM, COUNTS, run_dir=resumed)
    assert distance(committed(resumed, 2), committed(run_dir, 2)) < 1e-5


def test_central_dp_with_a_server_optimiser_is_refused_at_load():
    """Flower's DP wrapper noises theta after the server's step: momentum would carry
    earlier rounds' updates without their noise."""
    from plasticlm.errors import PlasticError

    with pytest.raises(PlasticError, match="server_opt=avgm would keep earlier rounds"):
        from_dict(FedNLConfig, {"privacy": {"mode": "central-fixed"},
                                "aggregation": {"server_opt": "avgm"}})
    from_dict(FedNLConfig, {"privacy": {"mode": "central-fixed"}})   # FedAvg: as before
