"""The server strategy and the client app, called directly: bad replies, crashes, minimums."""

import json

import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    Metadata,
    MetricRecord,
    RecordDict,
)

from plasticlm.config import from_dict, override
from plasticlm.errors import PlasticError
from plasticlm.fednl.config import RUN_DIR_KEY, FedNLConfig, flower_run_config
from plasticlm.fednl.flower.checkpoint import Checkpointer
from plasticlm.fednl.flower.client_app import client_app
from plasticlm.fednl.flower.strategy import RoundFailed, ThetaAverage

THETA = {"w": torch.ones(2, 3), "b": torch.zeros(3)}


def meta(src: int, kind=MessageType.TRAIN) -> Metadata:
    return Metadata(run_id=1, message_id="", src_node_id=src, dst_node_id=0,
                    reply_to_message_id="x", group_id="", created_at=0.0, ttl=60.0,
                    message_type=kind)


def reply(pid: int, theta=None, n: int = 10, error: Error | None = None) -> Message:
    if error is not None:
        return Message(metadata=meta(pid), error=error)
    content = RecordDict({
        "arrays": ArrayRecord(theta if theta is not None else THETA),
        "metrics": MetricRecord({"num-examples": n, "partition-id": pid, "local-acc": 0.5,
                                 "train_loss": 1.0}),
        "client": ConfigRecord({"name": f"c{pid}", "domain": "stem"})})
    return Message(metadata=meta(pid), content=content)


def run_context(cfg: FedNLConfig, run_dir, node_config: dict) -> Context:
    """A node's Context in ``cfg``'s run: the run config as Flower carries it (dotted keys
    and the run folder), read by the client once per run."""
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                   run_config={**flower_run_config(cfg), RUN_DIR_KEY: str(run_dir)})


# a round's message carries theta and the round, nothing else
ROUND_1 = ConfigRecord({"server-round": 1})


@pytest.fixture
def strategy(tmp_path):
    cfg = override(FedNLConfig(), {"federation.min_clients": 2})
    s = ThetaAverage(cfg, Checkpointer(tmp_path, cfg), start_round=0, num_nodes=5)
    s.reference = {k: v.clone() for k, v in THETA.items()}
    s.record = {"round": 1, "t0": 0.0, f"sent_{MessageType.TRAIN}": 6}
    return s


def test_bad_replies_are_rejected_and_the_rest_aggregated(strategy, caplog):
    nan = {"w": THETA["w"].clone(), "b": THETA["b"].clone()}
    nan["w"][0, 0] = float("nan")
    # two honest clients that both moved (a client that did not move would put the round's
    # median update norm at 0, and clipping at its floor: test_hostile_replies)
    replies = [reply(0, {k: v + 1 for k, v in THETA.items()}, n=30),
               reply(1, {k: v + 0.5 for k, v in THETA.items()}, n=10),
               reply(2, nan), reply(3, {"w": torch.zeros(5, 3), "b": THETA["b"]}),
               reply(4, {"w": THETA["w"]}), reply(5, error=Error(code=2, reason="boom"))]
    arrays, metrics = strategy.aggregate_train(1, replies)
    theta = arrays.to_torch_state_dict()
    assert torch.allclose(theta["w"], torch.full((2, 3), 1.875))  # (2*30 + 1.5*10) / 40
    assert metrics["clients"] == 2
    assert len(strategy.record["rejected"]) == 4
    assert "NaN" in caplog.text and "boom" in caplog.text


def test_too_few_valid_replies_fail_the_round_and_keep_the_checkpoint(strategy, tmp_path):
    strategy.checkpointer.commit(1, THETA, {"round": 1, "clients": {}})
    strategy.record["round"] = 2
    with pytest.raises(RoundFailed, match="min_clients=2"):
        strategy.aggregate_train(2, [reply(0), reply(1, error=Error(code=5, reason="timeout"))])
    assert json.loads((tmp_path / "checkpoint.json").read_text())["round"] == 1
    round_, theta = strategy.checkpointer.latest(THETA)
    assert round_ == 1 and torch.equal(theta["w"], THETA["w"])


def test_client_app_trains_and_evaluates_when_called_directly(tmp_path):
    cfg = from_dict(FedNLConfig, {
        "model": "sandbox-quick:receiver",
        "data": {"source": "sandbox-quick", "max_train": 8, "max_test": 4},
        "method": {"name": "fedssi"}, "train": {"local_steps": 2, "batch_size": 2},
        "outputs": {"client_state_dir": str(tmp_path)}})
    from plasticlm.fednl.build import initial_theta

    theta = initial_theta(cfg)
    config = ROUND_1
    ctx = run_context(cfg, tmp_path / "run", {"partition-id": 3, "num-partitions": 5})
    msg = Message(metadata=meta(0), content=RecordDict({"arrays": ArrayRecord(theta),
                                                        "config": config}))
    out = client_app(msg, ctx)
    assert not out.has_error(), out.error
    assert set(out.content["arrays"].keys()) == set(theta)
    assert 0.0 <= out.content["metrics"]["local-acc"] <= 1.0
    assert "personal" in ctx.state  # SI importances stay on the client
    assert (tmp_path / "client3" / "state_0001.safetensors").exists()
    ev = Message(metadata=meta(0, MessageType.EVALUATE),
                 content=RecordDict({"arrays": out.content["arrays"], "config": config}))
    res = client_app(ev, ctx)
    assert not res.has_error() and 0.0 <= res.content["metrics"]["fed-acc"] <= 1.0


def test_a_node_loads_its_own_model_and_data_and_keeps_its_state_where_it_says(tmp_path):
    """The run config names a model and data that do not exist and a state folder of the
    server's choosing; a node configured with its own paths uses those and writes nothing
    where the server said."""
    server_dir, own_dir = tmp_path / "server-chose", tmp_path / "node-chose"
    cfg = from_dict(FedNLConfig, {
        "model": "/nonexistent/model",
        "data": {"source": "/nonexistent/data", "max_train": 8, "max_test": 4},
        "method": {"name": "fedssi"}, "train": {"local_steps": 2, "batch_size": 2},
        "outputs": {"client_state_dir": str(server_dir)}})
    from plasticlm.fednl.build import initial_theta

    theta = initial_theta(override(cfg, {"model": "sandbox-quick:receiver",
                                         "data.source": "sandbox-quick"}))
    config = ROUND_1
    node = {"partition-id": 1, "num-partitions": 5, "model": "sandbox-quick:receiver",
            "data": "sandbox-quick", "state-dir": str(own_dir)}
    ctx = run_context(cfg, tmp_path / "run", node)
    out = client_app(Message(metadata=meta(0), content=RecordDict(
        {"arrays": ArrayRecord(theta), "config": config})), ctx)
    assert not out.has_error(), out.error
    assert (own_dir / "client1" / "state_0001.safetensors").exists()
    assert not server_dir.exists()
    # without its own paths the node follows the run config (here: a model that is not
    # there), as in the simulation
    ctx = run_context(cfg, tmp_path / "run", {"partition-id": 1, "num-partitions": 5})
    with pytest.raises(PlasticError, match="nonexistent"):
        client_app(Message(metadata=meta(0), content=RecordDict(
            {"arrays": ArrayRecord(theta), "config": config})), ctx)
