"""The FedNL server against hostile and broken replies: each is rejected with a logged reason
or bounded, the round goes on with the rest, and the server never crashes."""

import json
import math

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    Metadata,
    MetricRecord,
    RecordDict,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plasticlm.config import override
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.flower.checkpoint import Checkpointer
from plasticlm.fednl.flower.strategy import RoundFailed, ThetaAverage

FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
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
        cfg = override(FedNLConfig(), {"federation.min_clients": 2, "data.max_train": 96,
                                       "aggregation.rule": rule})
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


# Fuzzed replies: any metrics, client record and arrays a node could send.
NUMBERS = st.one_of(st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
                    st.lists(st.integers(-5, 5), max_size=3),
                    st.lists(st.floats(allow_nan=True), max_size=3))
METRIC_KEYS = st.sampled_from(["num-examples", "partition-id", "train_loss", "fed-acc",
                               "local-acc", "x"])
TEXTS = st.one_of(st.text(max_size=50), st.integers(), st.floats(allow_nan=True), st.booleans(),
                  st.binary(max_size=20))
DTYPES = st.sampled_from(["float32", "float16", "float64", "int64", "int8", "bool", "complex64",
                          "<U3", "uint8"])


@st.composite
def arrays(draw):
    keys = draw(st.lists(st.sampled_from(["w", "gate_logit", "extra"]), unique=True, max_size=3))
    out = {}
    for k in keys:
        shape = THETA[k].shape if k in THETA and draw(st.booleans()) else \
            tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        dtype = np.dtype(draw(DTYPES))
        values = draw(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32),
                               min_size=1, max_size=1))[0]
        with np.errstate(all="ignore"):
            out[k] = Array(np.full(shape, values if dtype.kind in "fc" else 1).astype(dtype))
        if draw(st.integers(0, 3)) == 0:   # headers that lie about the bytes
            out[k] = Array(dtype=draw(st.sampled_from(["float32", "float16", "<U3"])),
                           shape=tuple(THETA.get(k, THETA["w"]).shape), stype="numpy.ndarray",
                           data=draw(st.one_of(st.binary(max_size=200),
                                               st.just(out[k].data[:-3]))))
    return ArrayRecord(out)


@st.composite
def replies(draw, kind):
    if draw(st.booleans()):   # well-formed metrics and client record: the arrays are tried
        metrics = {"num-examples": draw(st.integers(1, 10**6)),
                   "partition-id": draw(st.integers(0, 4)), "train_loss": 1.0, "fed-acc": 0.5}
        client = {"name": "c", "domain": "d", "runtime": draw(TEXTS)}
    else:
        metrics = draw(st.dictionaries(METRIC_KEYS, NUMBERS, max_size=6))
        client = draw(st.dictionaries(st.sampled_from(["name", "domain", "runtime", "y"]),
                                      TEXTS, max_size=4))
    content = {}
    if draw(st.integers(0, 9)):
        content["metrics"] = MetricRecord(metrics)
    if draw(st.integers(0, 9)):
        content["client"] = ConfigRecord(client)
    if kind == MessageType.TRAIN and draw(st.integers(0, 9)):
        content["arrays"] = draw(arrays())
    pid = metrics.get("partition-id", 9)
    src = abs(pid) % 100 if isinstance(pid, int) else 9
    return Message(metadata=meta(src, kind), content=RecordDict(content))


@FUZZ
@given(st.lists(st.one_of(replies(MessageType.TRAIN), st.builds(reply, st.integers(0, 4))),
                max_size=6),
       st.lists(st.one_of(replies(MessageType.EVALUATE),
                          st.builds(reply, st.integers(0, 4), kind=st.just(MessageType.EVALUATE))),
                max_size=6))
def test_any_replies_are_aggregated_or_fail_the_round_cleanly(tmp_path_factory, train, evaluate):
    """Whatever the nodes send, a round aggregates the valid replies (theta keeps its keys,
    shapes and finite values) or fails with RoundFailed; nothing else is raised, and a round
    is committed only with a finite accuracy."""
    folder = tmp_path_factory.mktemp("fuzz")
    cfg = override(FedNLConfig(), {"federation.min_clients": 1, "data.max_train": 96})
    s = ThetaAverage(cfg, Checkpointer(folder, cfg), start_round=0, num_nodes=5)
    s.reference = {k: v.clone() for k, v in THETA.items()}
    s.record = {"round": 1, "t0": 0.0, f"sent_{MessageType.TRAIN}": 5}
    try:
        result, _ = s.aggregate_train(1, train)
    except RoundFailed:
        return
    theta = result.to_torch_state_dict()
    assert set(theta) == set(THETA)
    assert all(theta[k].shape == THETA[k].shape and torch.isfinite(theta[k]).all() for k in THETA)
    assert len(s.record.get("rejected", [])) + len(s.record["clients"]) <= len(train)
    try:
        s.aggregate_evaluate(1, evaluate)
    except RoundFailed:
        assert not (folder / "checkpoint.json").exists()
        return
    committed = Checkpointer(folder, cfg).records()[-1]
    assert math.isfinite(committed["mean_fed_acc"]) and 0 <= committed["mean_fed_acc"] <= 1


@pytest.mark.parametrize("array, reason", [
    (Array(np.array(["1", "2"])), "gate_logit has dtype <U1"),
    (Array(np.ones(2, dtype=np.complex64)), "gate_logit has dtype complex64"),
    (Array(dtype="float32", shape=(2,), stype="numpy.ndarray", data=b"garbage"),
     "arrays could not be read"),
    (Array(np.ones(3, dtype=np.float32)), "gate_logit has shape (3,)"),
])
def test_arrays_that_are_not_theta_are_rejected_not_read(server, array, reason):
    """Found by the fuzzing above: text and complex arrays, and bytes that are not the array
    their header announces, crashed the server or were cast silently."""
    s = server()
    bad = reply(2, {k: Array(v.numpy()) for k, v in THETA.items()})
    bad.content["arrays"]["gate_logit"] = array
    s.aggregate_train(1, [reply(0), reply(1), bad])
    assert len(s.record["rejected"]) == 1 and reason in s.record["rejected"][0]


def test_a_zero_norm_majority_cannot_switch_clipping_off(server):
    """Four clients that did not move (median update norm 0) and one that pushes the gate to
    -600,002: clipping falls back to its absolute floor, under every rule."""
    push = {k: v.clone() for k, v in THETA.items()}
    push["gate_logit"] = torch.full((2,), -600_002.0)
    for rule in ("mean", "median", "trimmed_mean", "krum"):
        s = server(rule)
        same = [reply(i, {k: v.clone() for k, v in THETA.items()}) for i in range(4)]
        arrays, _ = s.aggregate_train(1, same + [reply(4, push)])
        theta = arrays.to_torch_state_dict()
        moved = float((theta["gate_logit"] - THETA["gate_logit"]).abs().max())
        assert moved <= s.cfg.aggregation.clip_floor + 1e-6, (rule, moved)
        if rule == "mean":
            assert s.record["aggregation"]["clipped"] == [4]


def test_an_aggregate_over_the_step_bound_is_refused_and_the_previous_theta_kept(server,
                                                                                  caplog):
    """With clipping off, one client's huge update makes a step over ``max_step`` (and a
    float32 overflow makes one that is not finite): the round keeps the previous theta, says
    why, and commits it as that round's."""
    for value in (5e3, 3e38):
        s = server()
        s.cfg = override(s.cfg, {"aggregation.clip": 0.0})
        big = {k: v.clone() for k, v in THETA.items()}
        big["w"] = torch.full((2, 3), value)
        arrays, _ = s.aggregate_train(1, [reply(0, big), reply(1, big), reply(2)])
        theta = arrays.to_torch_state_dict()
        assert all(torch.equal(theta[k], THETA[k]) for k in THETA)
        assert "previous theta is kept" in caplog.text
        assert "max_step" in s.record["aggregation"]["refused"] or \
            "non-finite" in s.record["aggregation"]["refused"]


def test_a_refused_round_leaves_the_server_optimisers_state_as_it_was(server):
    """Server momentum: a refused aggregate must not enter the momentum buffer (the next
    rounds would carry it); an accepted one does."""
    from plasticlm.fednl.registries import SERVER_OPTIMIZERS

    s = server()
    s.cfg = override(s.cfg, {"aggregation.clip": 0.0, "aggregation.server_opt": "avgm"})
    s.server_opt = SERVER_OPTIMIZERS["avgm"](s.cfg.aggregation)
    s.server_state = {"m": torch.full((8,), 0.01)}
    big = {k: v.clone() for k, v in THETA.items()}
    big["w"] = torch.full((2, 3), 5e3)
    s.aggregate_train(1, [reply(0, big), reply(1, big), reply(2)])
    assert "refused" in s.record["aggregation"]
    assert torch.equal(s.pending_state["m"], torch.full((8,), 0.01))
    small = {k: v + 0.01 for k, v in THETA.items()}
    s.aggregate_train(1, [reply(0, small), reply(1, small), reply(2, small)])
    assert "refused" not in s.record["aggregation"]
    assert torch.allclose(s.pending_state["m"], torch.full((8,), 0.9 * 0.01 + 0.01))


@pytest.mark.parametrize("key", ["clip", "clip_floor", "max_step", "trim", "server_lr",
                                 "server_momentum", "server_beta2", "server_tau"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
def test_every_numeric_aggregation_setting_refuses_nan_inf_and_negatives(key, value):
    from plasticlm.config import load_config
    from plasticlm.errors import PlasticError
    from plasticlm.fednl.config import app_config, from_flower_run_config

    with pytest.raises(PlasticError, match=rf"config aggregation\.{key}: "):
        load_config(FedNLConfig, None, [f"aggregation.{key}={value}"])
    # Flower's run config (a deployment's `flwr run --run-config`): flattened, dotted keys
    flat = {}

    def walk(tree, prefix=""):
        for k, v in tree.items():
            walk(v, f"{prefix}{k}.") if isinstance(v, dict) else flat.__setitem__(prefix + k, v)
    walk(app_config())
    flat[f"aggregation.{key}"] = float(value)
    with pytest.raises(PlasticError, match=rf"config aggregation\.{key}: "):
        from_flower_run_config(flat)
