"""The FedNL server against hostile and broken replies: each is rejected with a logged reason
or bounded, the round goes on with the rest, and the server never crashes."""

import json

import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    Metadata,
    MetricRecord,
    RecordDict,
)

from plasticlm.fednl.checkpoint import Checkpointer
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.robust import AggregationConfig
from plasticlm.fednl.server_app import RoundFailed, ThetaAverage

THETA = {"w": torch.ones(2, 3), "gate_logit": torch.full((2,), -3.0)}


def meta(src: int, kind=MessageType.TRAIN) -> Metadata:
    return Metadata(run_id=1, message_id="", src_node_id=src, dst_node_id=0,
                    reply_to_message_id="x", group_id="", created_at=0.0, ttl=60.0,
                    message_type=kind)


def reply(pid, theta=None, n=10, loss=1.0, drop=(), kind=MessageType.TRAIN, acc=0.5):
    metrics = {"num-examples": n, "partition-id": pid, "train_loss": loss, "fed-acc": acc}
    for key in drop:
        metrics.pop(key, None)
    content = {"metrics": MetricRecord(metrics)}
    if "client" not in drop:
        content["client"] = ConfigRecord({"name": f"c{pid}", "domain": "stem"})
    if kind == MessageType.TRAIN:
        step = torch.Generator().manual_seed(int(pid) if isinstance(pid, int) else 0)
        content["arrays"] = ArrayRecord(theta if theta is not None else {
            k: v + 0.01 * torch.randn(v.shape, generator=step) for k, v in THETA.items()})
    return Message(metadata=meta(abs(int(pid)) if isinstance(pid, int) else 9, kind),
                   content=RecordDict(content))


@pytest.fixture
def server(tmp_path):
    def make(rule="mean"):
        cfg = FedNLConfig(min_clients=2, max_train=96, aggregation=AggregationConfig(rule=rule))
        s = ThetaAverage(cfg, Checkpointer(tmp_path, cfg), start_round=0, num_nodes=5)
        s.reference = {k: v.clone() for k, v in THETA.items()}
        s.record = {"round": 1, "t0": 0.0, f"sent_{MessageType.TRAIN}": 5}
        return s
    return make


def test_a_scaled_update_claiming_a_million_examples_cannot_switch_the_memory_off(server):
    poison = {k: v + 1000 * (v - 0.5) for k, v in THETA.items()}
    for rule in ("mean", "median", "trimmed_mean", "krum"):
        s = server(rule)
        arrays, _ = s.aggregate_train(1, [reply(0), reply(1), reply(2), reply(3),
                                          reply(4, poison, n=1_000_000)])
        theta = arrays.to_torch_state_dict()
        assert float((theta["gate_logit"] - THETA["gate_logit"]).abs().max()) < 1.0, rule
        assert s.record["aggregation"]["weights"][-1] <= 96


@pytest.mark.parametrize("bad, reason", [
    (dict(n=-10), "num-examples -10 is not positive"),
    (dict(n=0), "num-examples 0 is not positive"),
    (dict(loss=float("nan")), "train_loss nan is not a finite number"),
    (dict(drop=("partition-id",)), "metrics lack ['partition-id']"),
    (dict(drop=("train_loss",)), "metrics lack ['train_loss']"),
    (dict(drop=("client",)), "no client record (name, domain)"),
])
def test_each_broken_reply_is_rejected_with_its_reason(server, caplog, bad, reason):
    s = server()
    s.aggregate_train(1, [reply(0), reply(1), reply(2, **bad)])
    assert s.record["rejected"] == [reason] and reason in caplog.text


def test_out_of_range_and_duplicate_partition_ids_are_rejected(server):
    s = server()
    s.aggregate_train(1, [reply(0), reply(1), reply(1), reply(7)])
    assert s.record["rejected"] == ["duplicate partition-id 1",
                                    "partition-id 7 is not one of 0..4"]


def test_counts_summing_to_zero_fail_the_round_cleanly(server):
    s = server()
    with pytest.raises(RoundFailed, match="valid client replies"):
        s.aggregate_train(1, [reply(0, n=0), reply(1, n=0)])


def test_an_evaluation_round_needs_min_clients_and_commits_no_nan(server, tmp_path):
    s = server()
    s.aggregate_train(1, [reply(0), reply(1)])
    with pytest.raises(RoundFailed, match="valid evaluation replies"):
        s.aggregate_evaluate(1, [])
    with pytest.raises(RoundFailed):
        s.aggregate_evaluate(1, [reply(0, kind=MessageType.EVALUATE, acc=7.0),
                                 reply(1, kind=MessageType.EVALUATE)])
    assert not (tmp_path / "checkpoint.json").exists()
    s.aggregate_evaluate(1, [reply(0, kind=MessageType.EVALUATE),
                             reply(1, kind=MessageType.EVALUATE)])
    assert json.loads((tmp_path / "checkpoint.json").read_text())["round"] == 1


def test_an_oversized_reply_is_refused_before_it_becomes_tensors(server):
    s = server()
    huge = {**THETA, "w": torch.zeros(2, 3), "padding": torch.zeros(100_000)}
    s.aggregate_train(1, [reply(0), reply(1), reply(2, huge)])
    assert len(s.record["rejected"]) == 1 and "more than the" in s.record["rejected"][0]
