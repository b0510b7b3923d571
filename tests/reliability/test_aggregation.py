"""A hostile client cannot take over the federation: weights from what the server knows,
norms clipped against the other clients', robust rules; honest rounds are unchanged."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plasticlm.config import from_dict
from plasticlm.errors import PlasticError
from plasticlm.fednl.aggregators import clip_updates, robust_aggregate
from plasticlm.fednl.config_sections import AggregationConfig
from plasticlm.fednl.registries import AGGREGATORS
from plasticlm.fednl.replies import weighted_mean

RULES = AGGREGATORS.names()


def honest(n: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    current = {"a": torch.randn(4, 3, generator=gen), "gate_logit": torch.zeros(2)}
    thetas = [{k: v + 0.01 * torch.randn(v.shape, generator=gen) for k, v in current.items()}
              for _ in range(n)]
    return current, thetas


def poisoned(current, theta, scale=1000.0):
    return {k: current[k] + scale * (theta[k] - current[k]) for k in current}


def distance(x, y):
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def test_a_poisoned_client_moves_plain_fedavg_and_no_robust_rule():
    current, thetas = honest()
    counts = [96] * 5
    clean = weighted_mean(thetas, counts)
    attack = thetas[:4] + [poisoned(current, thetas[4])]
    claimed = counts[:4] + [1e6]
    naive = weighted_mean(attack, claimed)              # trusts the claim, no bound
    assert distance(naive, clean) > 1.0
    for rule in RULES:
        out, info = robust_aggregate(attack, claimed, current, AggregationConfig(rule=rule),
                                     max_examples=96)
        assert distance(out, clean) < 0.05, rule
        assert info["weights"][4] == 96                 # the claim is clipped to what it was given
    _, info = robust_aggregate(attack, claimed, current, AggregationConfig(), max_examples=96)
    assert info["clipped"] == [4]


def test_negative_zero_and_nan_counts_do_not_flip_or_crash_the_mean():
    current, thetas = honest(3)
    out, info = robust_aggregate(thetas, [-10, 5, float("nan")], current, AggregationConfig(),
                                 max_examples=96)
    assert info["weights"] == [0.0, 5.0, 0.0]
    assert distance(out, thetas[1]) < 1e-6
    with pytest.raises(ValueError, match="zero"):
        robust_aggregate(thetas, [0, 0, 0], current, AggregationConfig(), max_examples=96)


def test_honest_rounds_match_fedavg_when_nothing_is_clipped():
    current, thetas = honest()
    counts = [10, 20, 30, 40, 50]
    out, info = robust_aggregate(thetas, counts, current, AggregationConfig(), max_examples=96)
    assert info["clipped"] == [] and distance(out, weighted_mean(thetas, counts)) < 1e-5


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 7), rule=st.sampled_from(RULES), seed=st.integers(0, 10_000))
def test_identical_clients_give_back_their_theta_under_every_rule(n, rule, seed):
    current, thetas = honest(1, seed)
    out, _ = robust_aggregate(thetas * n, [1] * n, current, AggregationConfig(rule=rule),
                              max_examples=96)
    assert distance(out, thetas[0]) < 1e-5


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 8), factor=st.floats(0.5, 20), seed=st.integers(0, 10_000))
def test_clipped_norms_never_exceed_the_bound(rows, factor, seed):
    updates = torch.randn(rows, 6, generator=torch.Generator().manual_seed(seed))
    updates[0] *= 1e4
    out, _ = clip_updates(updates, factor)
    bound = factor * float(updates.norm(dim=1).median())
    assert float(out.norm(dim=1).max()) <= bound * (1 + 1e-5)


def test_bad_settings_are_refused():
    with pytest.raises(PlasticError, match="config rule: unknown aggregation rule 'avg'; "
                                           "choose one of mean, median"):
        from_dict(AggregationConfig, {"rule": "avg"})
    with pytest.raises(PlasticError, match="config trim: input should be less than 0.5"):
        from_dict(AggregationConfig, {"trim": 0.5})
