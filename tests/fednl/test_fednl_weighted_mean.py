"""Federation end to end (issue 41, item 4): two clients that hold different data, 3 and 9
training examples, run 2 rounds through the real ServerApp rounds (Flower's ``FedAvg.start``
driving :class:`ThetaAverage`) and the real ClientApp (its mods included), in one process.

What the clients returned is read off the wire (each training reply, as the server got it);
what they trained from is read inside the client's local update (the theta set on the model
before its first step). The server's committed theta of each round must be the
example-weighted mean of its clients' replies, and every client must start round 2 from the
server's round-1 aggregate: a server that stops sending the new average, or averages without
the example counts, fails here."""


import pytest
from inprocess_run import committed, distance, federate, mean

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


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return federate(tmp_path_factory, CONFIG, COUNTS)


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
