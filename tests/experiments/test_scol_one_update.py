"""One inner update beside its controls (plasticlm.experiments.scol.one_update) on the quick sandbox:
the report's rows, an untouched row that no seed's update reaches, an update confined to
LoRA on the named layer, and a paired entity that is neither the passage's nor trained on."""

from __future__ import annotations

import pytest

from plasticlm.experiments.scol import one_update as ou


@pytest.fixture(scope="module")
def quick(one_thread):
    from plasticlm.sandbox import get_preset, sandbox_model
    from plasticlm.sandbox.world import generate_world

    return sandbox_model("receiver", preset="quick"), generate_world(get_preset("quick").world)


def _fingerprint(model) -> float:
    return sum(float(p.detach().double().sum()) for p in model.parameters())


@pytest.fixture(scope="module")
def run(quick):
    """One quick run; every scoring call's model fingerprint and every text an update
    learned are recorded."""
    from plasticlm.scol import consolidate

    scored_by, learned = [], []
    real_chosen, real_windows = ou._chosen, consolidate.context_windows

    def chosen(model, tok, items):
        scored_by.append(_fingerprint(model))
        return real_chosen(model, tok, items)

    def windows(tok, text, max_tokens):
        learned.append(text)
        return real_windows(tok, text, max_tokens)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ou, "_chosen", chosen)
        mp.setattr(consolidate, "context_windows", windows)
        report = ou.run_one_update(*quick, **ou.QUICK_SIZES, progress=False)
    return report, scored_by, learned


@pytest.fixture(scope="module")
def report(run):
    return run[0]


def test_every_row_and_difference_is_there_with_values_in_0_1(report):
    seeds, items = ou.QUICK_SIZES["seeds"], report["items"]
    assert items == 3 * ou.QUICK_SIZES["passages"]   # three closed attributes per entity
    for r in ou.ROWS:
        assert len(report["correct"][r]) == seeds, r
        assert all(len(s) == items and set(s) <= {0.0, 1.0} for s in report["correct"][r]), r
        ci = report["table"][r]["accuracy"]
        assert 0 <= ci["low"] <= ci["mean"] <= ci["high"] <= 1, r
    for d in ou.DIFFS:
        assert -1 <= report["table"][d]["pooled"]["mean"] <= 1, d
    table = ou.one_update_table(report)
    assert "Chance: " in table and all(ou.ROWS[r] in table for r in ou.ROWS)


def test_the_untouched_rows_do_not_change_with_the_seed(quick, run):
    from plasticlm.models import load_causal_lm

    report, scored_by, _ = run
    # scored again under every seed, after the earlier seeds' updates
    for r in ("a", "a2", "a2_leak"):
        first, *rest = report["correct"][r]
        assert rest and all(s == first for s in rest), r
    # and by the receiver's own weights each time: (a) and (a') per passage and seed
    receiver = _fingerprint(load_causal_lm(quick[0], dtype="float32", device="cpu")[0])
    sizes = ou.QUICK_SIZES
    assert scored_by.count(receiver) == 2 * sizes["passages"] * sizes["seeds"]
    assert len(scored_by) == 4 * sizes["passages"] * sizes["seeds"]


def test_the_update_changes_only_the_named_layers_mlp(quick, report):
    last = report["layers"] - 1
    assert report["layer"] == last
    assert report["changed"] == [f"model.layers.{last}.mlp.{m}.weight"
                                 for m in ("down_proj", "gate_proj", "up_proj")]
    first = ou.run_one_update(*quick, passages=1, seeds=1, layer=0, steps=2, progress=False)
    assert first["changed"] and all(n.startswith("model.layers.0.mlp.")
                                    for n in first["changed"])


def test_the_paired_entity_is_never_the_passages_nor_trained_on(quick, run):
    world = quick[1]
    report, _, learned = run
    domain = {e.name: e.domain for e in world.entities}
    text = {p.title: p.context for p in world.passages}
    assert len(report["scored"]) == report["items"]
    for entity, partner, _ in report["scored"]:
        assert partner != entity and domain[partner] == domain[entity]
        assert not any(partner in t for t in learned)   # no update saw the partner
    # the updates learned exactly the passages of the entities asked about, once per seed
    assert sorted(learned) == sorted(text[e] for e in {e for e, _, _ in report["scored"]}
                                     for _ in range(ou.QUICK_SIZES["seeds"]))
    # every pairing the quick world allows (two unseen entities per domain) is disjoint
    pairs = ou.paired_passages(world, 5)
    titles = [p.title for pair in pairs for p in pair]
    assert len(set(titles)) == len(titles) == 10
    with pytest.raises(ValueError, match="pairs only 5"):
        ou.paired_passages(world, 6)
