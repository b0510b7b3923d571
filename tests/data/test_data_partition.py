"""Non-IID partitions: the 57-subject domain map, one NIAH task per client, Dirichlet."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plasticlm.data import (
    CLIENT_DOMAINS,
    MMLU_CLIENT_DOMAIN,
    TASKS,
    load_mmlu,
    mmlu_subjects,
    partition_by_domain,
    partition_by_task,
    partition_dirichlet,
)
from plasticlm.errors import PlasticError
from plasticlm.sandbox import WORLD_CLIENT_DOMAIN


def test_mapping_covers_the_real_57_subjects(shared_data):
    subjects = mmlu_subjects(shared_data / "mmlu", "test")
    assert sorted(MMLU_CLIENT_DOMAIN) == subjects
    assert set(MMLU_CLIENT_DOMAIN.values()) == set(CLIENT_DOMAINS)
    qs = load_mmlu(shared_data / "mmlu", "dev")
    parts = partition_by_domain([q.subject for q in qs])
    assert [len(p) for p in parts] == [5 * n for n in (10, 9, 13, 12, 13)]
    assert sorted(i for p in parts for i in p) == list(range(len(qs)))


def test_domain_partition_of_world_subjects():
    subjects = ["law", "software", "law", "geography", "pharmacology", "biography"]
    parts = partition_by_domain(subjects, WORLD_CLIENT_DOMAIN)
    assert parts == [[4], [1], [5], [0, 2], [3]]
    with pytest.raises(PlasticError, match="no client domain"):
        partition_by_domain(["astrology"])


def test_one_task_per_client():
    tasks = [TASKS[i % 7] for i in range(21)] + ["single"]
    parts = partition_by_task(tasks)
    assert len(parts) == 7 and [len(p) for p in parts] == [4] + [3] * 6
    assert all(len({tasks[i] for i in p}) == 1 for p in parts)
    with pytest.raises(PlasticError, match="not one of"):
        partition_by_task(["bogus"])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), labels=st.integers(1, 6), clients=st.integers(1, 8),
       alpha=st.floats(0.05, 100.0), seed=st.integers(0, 1000))
def test_dirichlet_is_a_seeded_partition(n, labels, clients, alpha, seed):
    y = [i % labels for i in range(n)]
    parts = partition_dirichlet(y, clients, alpha, seed)
    assert len(parts) == clients
    assert sorted(i for p in parts for i in p) == list(range(n))
    assert parts == partition_dirichlet(y, clients, alpha, seed)


def _label_entropy(parts, y):
    ent = []
    for p in parts:
        c = np.array(list(Counter(y[i] for i in p).values()), float)
        if c.sum():
            q = c / c.sum()
            ent.append(-(q * np.log(q)).sum())
    return float(np.mean(ent))


def test_small_alpha_is_more_skewed_than_large():
    y = [i % 4 for i in range(2000)]
    skewed = np.mean([_label_entropy(partition_dirichlet(y, 5, 0.1, s), y) for s in range(5)])
    mixed = np.mean([_label_entropy(partition_dirichlet(y, 5, 100.0, s), y) for s in range(5)])
    assert mixed > np.log(4) - 0.05 > skewed + 0.3


def test_dirichlet_errors_and_min_size():
    y = ["A"] * 50 + ["B"] * 50
    assert min(len(p) for p in partition_dirichlet(y, 4, 0.5, seed=0, min_size=5)) >= 5
    with pytest.raises(PlasticError, match="alpha must be positive"):
        partition_dirichlet(y, 3, 0.0)
    with pytest.raises(PlasticError, match="could not give"):
        partition_dirichlet(y, 3, 1.0, min_size=60)
