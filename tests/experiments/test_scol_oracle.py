"""SCoL's continuous reward (the gold answers' log-likelihood) and the layer oracle on
colliding streams."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plasticlm.data.records import QA, Answer, Passage
from plasticlm.experiments.scol.oracle import (
    colliding_streams,
    layer_sets,
    pick_entropy_bits,
    summarise,
)
from plasticlm.experiments.scol.setup import ExperimentConfig
from plasticlm.scol.consolidate import LoraTrainConfig, adapt_lora, context_windows
from plasticlm.scol.contexts import contexts_from_passages
from plasticlm.scol.meta import SCoLConfig
from plasticlm.scol.rewards import loglik_reward, reward_probe

DRUGS = [("Tamasartan", "glaucoma"), ("Velizole", "asthma"), ("Quinomab", "gout"),
         ("Lorepril", "eczema")]
PLACES = [("Orvane", "Keltis"), ("Munder", "Pyrrha"), ("Caddis", "Tolland"),
          ("Fenwick", "Dorran")]

floats = st.lists(st.floats(-5, 5), min_size=0, max_size=6)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 64), st.integers(1, 50))
def test_pick_entropy_is_zero_for_one_answer_and_log2_k_for_k_equal_ones(k, n):
    assert pick_entropy_bits([n]) == 0.0
    assert pick_entropy_bits([n] * k + [0]) == pytest.approx(math.log2(k))
    assert pick_entropy_bits([n, 3 * n]) < 1.0       # uneven picks: less than a fair coin


@given(floats, floats, st.floats(0, 3))
def test_loglik_reward_is_the_gain_minus_lambda_times_the_loss(cur, earlier, lam):
    """acquisition = mean gain on the context's answers; forgetting = mean loss on earlier
    answers; total = acquisition - lam * forgetting; nothing changed: all zero."""
    after_c = [x + 0.5 for x in cur]          # every current answer gains 0.5 nats/token
    after_e = [x - 0.25 for x in earlier]     # every earlier answer loses 0.25
    r = loglik_reward(cur, after_c, earlier, after_e, lam)
    assert r.acquisition == pytest.approx(0.5 if cur else 0.0)
    assert r.forgetting == pytest.approx(0.25 if earlier else 0.0)
    assert r.total == pytest.approx(r.acquisition - lam * r.forgetting)
    same = loglik_reward(cur, cur, earlier, earlier, lam)
    assert (same.acquisition, same.forgetting, same.total) == (0.0, 0.0, 0.0)


def _drug(i, name, cond):
    text = f"Doctors prescribe {name} for {cond}. {name} treats {cond}."
    return Passage(name, text, (QA(f"pharmacology.unseen.{i}.treats",
                                   f"What condition is {name} used to treat?",
                                   (Answer(cond, text.index(cond)),)),))


def _place(i, name, river):
    text = f"The town of {name} lies on the {river} river."
    return Passage(name, text, (QA(f"geography.unseen.{i}.river",
                                   f"Which river does {name} lie on?",
                                   (Answer(river, text.index(river)),)),))


@pytest.fixture(scope="module")
def world(tiny_squad_world, one_thread):
    passages = [_drug(i, *d) for i, d in enumerate(DRUGS)] + \
        [_place(i, *p) for i, p in enumerate(PLACES)]
    folder, model, tok = tiny_squad_world(passages, "scol_oracle")
    return folder, model, tok, passages


def test_the_loglik_reward_sees_an_update_write_the_answer(world):
    """An update on the context raises its gold answer's log-likelihood (acquisition > 0)
    where 0/1 accuracy of an untrained model sees nothing; at lr 1e-9 it stays ~0."""
    _, model, tok, passages = world
    contexts = contexts_from_passages(passages[:2])
    cfg = SCoLConfig(reward="loglik", forget_window=1, lam=1.0)
    probe = reward_probe(model, tok, contexts, 1, cfg)
    windows = context_windows(tok, contexts[1].text, 64)
    learned, _ = adapt_lora(model, (0, 1, 2), windows,
                            LoraTrainConfig(lr=1e-2, steps=20, rank=4, replay=0), 0)
    idle, _ = adapt_lora(model, (0, 1, 2), windows,
                         LoraTrainConfig(lr=1e-9, steps=20, rank=4, replay=0), 0)
    assert probe(learned).acquisition > 0.3
    assert abs(probe(idle).acquisition) < 1e-4 and abs(probe(idle).total) < 1e-4
    supervised = reward_probe(model, tok, contexts, 1, SCoLConfig(reward="supervised"))
    assert supervised(learned).total == supervised(idle).total == 0.0   # 0/1 ties them


def test_colliding_streams_keep_to_one_domain_per_seed(world):
    folder, *_ = world
    cfg = ExperimentConfig(model=str(folder / "model"), squad=str(folder / "squad.json"),
                           eval_length=4, seeds=2)
    streams = colliding_streams(cfg)
    assert [d for d, _ in streams] == ["geography", "pharmacology"]
    for domain, stream in streams:
        assert len(stream) == 4
        names = {c.id for c in stream}
        assert names == ({p for p, _ in PLACES} if domain == "geography"
                         else {d for d, _ in DRUGS})


def test_layer_sets_are_every_set_up_to_the_size():
    assert layer_sets(3, 1) == [(0,), (1,), (2,)]
    assert len(layer_sets(8, 2)) == 8 + 28


def test_oracle_cli_picks_by_seed_a_scores_by_seed_b_and_reports_ties(world, tmp_path, capsys):
    """The committed set is the best of seed A's loglik rewards; the margins compare seed
    B's rewards; ties are counted per reward."""
    from plasticlm.cli import main

    folder, *_ = world
    out = tmp_path / "oracle"
    assert main(["scol", "experiment", "oracle", "--out", str(out), "--no-progress",
                 "--set", f"model={folder / 'model'}", "--set",
                 f"squad={folder / 'squad.json'}", "--set", "eval_length=3", "--set",
                 "seeds=2", "--set", "scol.lora.steps=3", "--set", "scol.lora.replay=0",
                 "--set", "scol.forget_window=2"]) == 0
    assert "oracle - last" in capsys.readouterr().out
    report = json.loads((out / "oracle.json").read_text())
    records = [r for rs in report["records"] for r in rs]
    assert len(records) == 6
    for r in records:
        a = [x["loglik"]["total"] for x in r["rewards"]["A"]]
        assert r["pick"] == r["candidates"][max(range(len(a)), key=a.__getitem__)]
        assert len(r["rewards"]["B"]) == len(r["candidates"])
        assert [2] in r["candidates"]                    # the last layer alone is searched
    assert set(report["summary"]["ties"]) == {"loglik", "supervised"}
    assert "loglik.total: oracle - last" in report["summary"]["margins"]


def test_margins_are_measured_on_seed_b_not_on_the_seed_that_picked():
    """A pick that looks best only under its own seed's noise earns no margin."""
    def record(a, b):
        return {"candidates": [[0], [1]], "n_sets": 2, "policy": [0],
                "pick": [0] if a[0] > a[1] else [1],
                "rewards": {k: [{"loglik": {"total": v, "acquisition": v, "forgetting": 0.0},
                                 "supervised": {"total": 0.0}} for v in vals]
                            for k, vals in (("A", a), ("B", b))}}
    # seed A prefers layer 0, seed B scores both layers the same
    per_seed = [[record([1.0, 0.0], [0.5, 0.5]) for _ in range(4)] for _ in range(3)]
    summary = summarise(per_seed)
    margin = summary["margins"]["loglik.total: oracle - last"]["pooled"]
    assert margin["mean"] == pytest.approx(0.0)
    # the best fixed set is picked on seed A too, and scored on B like the oracle
    assert summary["best_fixed"] == [0]
    assert summary["margins"]["loglik.total: oracle - fixed"]["pooled"]["mean"] == 0.0
