"""FedNL's round checkpoints survive a kill at any write: the last two rounds are kept, a
damaged last theta falls back to the round before, a torn last metrics line is dropped."""

import json

import pytest
import torch

from plasticlm.errors import PlasticError
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.flower.checkpoint import Checkpointer

INITIAL = {"w": torch.zeros(3)}


def committed(tmp_path, rounds=3):
    ck = Checkpointer(tmp_path, FedNLConfig())
    for r in range(1, rounds + 1):
        ck.commit(r, {"w": torch.full((3,), float(r))}, {"round": r, "mean_fed_acc": r / 10})
    return ck


def test_the_last_two_rounds_are_kept(tmp_path):
    committed(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("round_*")) == ["round_0002", "round_0003"]
    assert not list(tmp_path.glob("round_*/*.partial"))


def test_a_damaged_last_theta_falls_back_to_the_round_before(tmp_path, caplog):
    ck = committed(tmp_path)
    theta = tmp_path / "round_0003" / "theta.safetensors"
    theta.write_bytes(theta.read_bytes()[:20])
    r, state = ck.latest(INITIAL)
    assert r == 2 and torch.equal(state["w"], torch.full((3,), 2.0))
    assert [x["round"] for x in ck.records()] == [1, 2] and ck.committed_round() == 2
    assert "resuming from round 2" in caplog.text


def test_both_kept_rounds_damaged_is_one_clear_error(tmp_path):
    ck = committed(tmp_path)
    for r in (2, 3):
        (tmp_path / f"round_{r:04d}" / "theta.safetensors").write_bytes(b"x")
    with pytest.raises(PlasticError, match="start a fresh run"):
        ck.latest(INITIAL)


def test_a_torn_last_metrics_line_is_dropped_and_a_torn_middle_one_is_not(tmp_path):
    ck = committed(tmp_path)
    with ck.metrics.open("a") as f:
        f.write('{"round": 4, "mean_fe')
    r, _ = ck.latest(INITIAL)
    assert r == 3 and [x["round"] for x in ck.records()] == [1, 2, 3]
    assert all(json.loads(line) for line in ck.metrics.read_text().splitlines())
    lines = ck.metrics.read_text().splitlines()
    ck.metrics.write_text("\n".join([lines[0], "{broken", *lines[1:]]) + "\n")
    with pytest.raises(PlasticError, match="line 2"):
        ck.latest(INITIAL)
