"""plasticlm.eval statistics (bootstrap, seed intervals) and control measures."""

import json
import random
from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plasticlm.eval import (
    CI,
    SwappedItem,
    bootstrap_ci,
    closed_set_accuracy,
    closed_set_choice,
    entity_swap_control,
    format_ci,
    format_paired,
    format_summary,
    is_legal,
    legal_answer_rate,
    paired_seed_ci,
    paired_summary,
    pooled_bootstrap_ci,
    seed_ci,
    swap_entity,
    t_critical,
    verdict,
)
from plasticlm.models import build_tiny, pack_corpus, train_bpe_tokenizer, train_lm

# --- bootstrap_ci ---------------------------------------------------------------------------


def test_constant_sample_has_zero_width_interval():
    ci = bootstrap_ci([0.7] * 25)
    assert ci.low == ci.high == ci.mean == pytest.approx(0.7)
    assert ci.width == 0 and ci.n == 25 and not ci.degenerate


def test_paired_interval_of_identical_samples_is_exactly_zero():
    x = [0, 1, 1, 0, 1, 0.5, 0.25]
    ci = bootstrap_ci(x, baseline=x)
    assert (ci.mean, ci.low, ci.high) == (0.0, 0.0, 0.0)
    assert not ci.significant and verdict(ci) == "no difference"


def test_paired_interval_is_the_interval_of_differences():
    rng = np.random.default_rng(1)
    a, b = rng.random(50), rng.random(50)
    assert bootstrap_ci(a, baseline=b, seed=3) == bootstrap_ci(a - b, seed=3)


def test_interval_contains_the_sample_mean_and_is_deterministic():
    x = np.random.default_rng(0).binomial(1, 0.3, size=80)
    ci = bootstrap_ci(x, seed=5)
    assert ci.mean == pytest.approx(x.mean())
    assert ci.low < ci.mean < ci.high
    y = np.random.default_rng(1).random(80)  # continuous: the seed moves the quantiles
    assert bootstrap_ci(y, seed=5) == bootstrap_ci(y, seed=5) != bootstrap_ci(y, seed=6)


def test_larger_sample_gives_a_narrower_interval():
    rng = np.random.default_rng(2)
    small = bootstrap_ci(rng.binomial(1, 0.5, size=50))
    large = bootstrap_ci(rng.binomial(1, 0.5, size=2000))
    assert large.width < small.width / 3


def test_cluster_bootstrap_is_wider_when_items_within_a_group_agree():
    # 20 entities with 10 items each; an entity's items are all right or all wrong.
    per_group = np.random.default_rng(3).binomial(1, 0.5, size=20)
    scores = np.repeat(per_group, 10)
    groups = np.repeat(np.arange(20), 10)
    naive, cluster = bootstrap_ci(scores), bootstrap_ci(scores, groups=list(groups))
    assert cluster.mean == naive.mean
    assert cluster.width > 2 * naive.width
    # Singleton groups are the plain item bootstrap.
    assert bootstrap_ci(scores, groups=list(range(200))).width == pytest.approx(
        naive.width, rel=0.2)


def test_bootstrap_coverage_of_a_known_mean_is_about_the_level():
    covered = 0
    for rep in range(300):
        x = np.random.default_rng(1000 + rep).binomial(1, 0.6, size=100)
        covered += bootstrap_ci(x, n_boot=500, seed=rep).contains(0.6)
    assert 0.90 <= covered / 300 <= 0.99


@pytest.mark.parametrize("kwargs, message", [
    (dict(scores=[]), "empty"),
    (dict(scores=[1, 2], baseline=[1]), "one baseline score per item"),
    (dict(scores=[1, 2], groups=["a"]), "one label per item"),
    (dict(scores=[1, float("nan")]), "NaN"),
    (dict(scores=[[1, 2]]), "flat"),
    (dict(scores=[1, 2], level=1.5), "level"),
])
def test_bootstrap_rejects_bad_input_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bootstrap_ci(**kwargs)


def test_single_unit_is_degenerate():
    assert bootstrap_ci([0.4]).degenerate
    assert bootstrap_ci([0.0, 1.0], groups=["e", "e"]).degenerate


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=2, max_size=40), st.floats(-5, 5))
def test_bootstrap_bounds_and_shift(xs, shift):
    ci = bootstrap_ci(xs, n_boot=200)
    assert min(xs) - 1e-9 <= ci.low <= ci.high <= max(xs) + 1e-9
    moved = bootstrap_ci([x + shift for x in xs], n_boot=200)
    assert moved.low == pytest.approx(ci.low + shift, abs=1e-6)
    assert moved.high == pytest.approx(ci.high + shift, abs=1e-6)


def test_pooled_bootstrap_concatenates_seeds_paired_by_position():
    a = [[1, 0, 1], [1, 1, 0, 0]]
    b = [[0, 0, 1], [1, 0, 0, 0]]
    flat_a, flat_b = [1, 0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0, 0]
    assert pooled_bootstrap_ci(a, b, seed=4) == bootstrap_ci(flat_a, flat_b, seed=4)
    with pytest.raises(ValueError, match="seed 1"):
        pooled_bootstrap_ci(a, [[0, 0, 1], [1]])


# --- seed_ci --------------------------------------------------------------------------------


def test_t_critical_matches_tables():
    assert t_critical(0.95, 1) == pytest.approx(12.706205, abs=1e-5)
    assert t_critical(0.95, 4) == pytest.approx(2.776445, abs=1e-6)
    assert t_critical(0.99, 30) == pytest.approx(2.749996, abs=1e-5)
    assert t_critical(0.95, 5000) == pytest.approx(1.960438, abs=1e-5)


def test_seed_ci_is_the_hand_computed_t_interval():
    # mean 3, sd sqrt(2.5), se sqrt(2.5 / 5), t(0.975, df 4) = 2.776445
    ci = seed_ci([1, 2, 3, 4, 5])
    half = 2.776445105 * (2.5 / 5) ** 0.5
    assert (ci.mean, ci.n) == (3, 5)
    assert ci.low == pytest.approx(3 - half) and ci.high == pytest.approx(3 + half)
    # per-seed item scores are reduced to their means first
    assert seed_ci([[0, 1], [1, 1], [0, 0]]) == seed_ci([0.5, 1.0, 0.0])


def test_seed_ci_of_one_seed_is_degenerate():
    ci = seed_ci([0.42])
    assert ci.degenerate and ci.low == ci.high == ci.mean == 0.42
    assert str(ci) == "42.0 [n=1]"
    with pytest.raises(ValueError, match="empty"):
        seed_ci([])


def test_paired_seed_ci_is_the_t_interval_of_the_seeds_differences():
    # seed differences 0.5 - 0.0, 0.75 - 0.5, 1.0 - 0.0: mean 7/12, sd 0.381881, t(df 2) 4.302653
    scores = [[1, 0, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    baseline = [[0, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]
    ci = paired_seed_ci(scores, baseline)
    half = 4.302652730 * 0.3818813079 / 3 ** 0.5
    assert (ci.mean, ci.n) == (pytest.approx(7 / 12), 3)
    assert ci.low == pytest.approx(7 / 12 - half) and ci.high == pytest.approx(7 / 12 + half)
    # a seed's shared luck cancels: the same shift in both recipes leaves the interval as it is
    lucky = paired_seed_ci([0.75, 0.5, 0.25], [0.5, 0.25, 0.0])
    assert (lucky.mean, lucky.low, lucky.high) == (0.25, 0.25, 0.25)
    assert seed_ci([0.75, 0.5, 0.25]).width > 1  # each recipe alone varies across seeds
    same = paired_seed_ci(scores, scores)
    assert (same.mean, same.low, same.high) == (0, 0, 0)
    assert paired_seed_ci([[1, 0]], [[0, 0]]).degenerate


def test_paired_seed_ci_refuses_unpaired_input():
    with pytest.raises(ValueError, match="seeds pair by position"):
        paired_seed_ci([0.5, 0.6], [0.5])
    with pytest.raises(ValueError, match="seed 1: 2 scores but 3"):
        paired_seed_ci([[1, 0], [1, 0]], [[1, 0], [1, 0, 0]])


# --- rendering and verdicts ----------------------------------------------------------------


def test_format_ci_renders_mean_and_bounds():
    ci = CI(mean=0.6043, low=0.5512, high=0.65, n=300, level=0.95)
    assert format_ci(ci) == "60.4 [55.1, 65.0]" == str(ci)
    assert format_ci(ci, scale=1, digits=3) == "0.604 [0.551, 0.650]"
    assert format_ci(CI(-0.0001, -0.0002, 0.0, 3, 0.95)) == "0.0 [0.0, 0.0]"


def test_verdict_reads_the_interval_of_a_difference():
    assert verdict(CI(0.05, 0.01, 0.09, 100, 0.95)) == "better"
    assert verdict(CI(-0.05, -0.09, -0.01, 100, 0.95)) == "worse"
    assert verdict(CI(0.02, -0.01, 0.05, 100, 0.95)) == "no difference"
    assert verdict(CI(-0.05, -0.09, -0.01, 100, 0.95), higher_is_better=False) == "better"


def test_verdict_of_a_recipe_needs_the_seeds_to_agree():
    items = CI(0.05, 0.02, 0.08, 1000, 0.95)
    assert verdict(items, over_seeds=CI(0.05, 0.03, 0.07, 3, 0.95)) == "better"
    # the items alone say better; three seeds' differences hold zero: no difference
    assert verdict(items, over_seeds=CI(0.05, -0.01, 0.11, 3, 0.95)) == "no difference"
    assert verdict(CI(-0.05, -0.08, -0.02, 1000, 0.95),
                   over_seeds=CI(-0.05, -0.07, -0.03, 3, 0.95)) == "worse"
    # one seed is no evidence over seeds: the items decide
    assert verdict(items, over_seeds=CI(0.05, 0.05, 0.05, 1, 0.95, degenerate=True)) == "better"
    # seeds of unequal size can put the two means on opposite sides: nothing is established
    assert verdict(items, over_seeds=CI(-0.01, -0.02, -0.005, 3, 0.95)) == "no difference"
    # a loss, where lower is better
    assert verdict(CI(-0.05, -0.08, -0.02, 1000, 0.95), higher_is_better=False,
                   over_seeds=CI(-0.05, -0.07, -0.03, 3, 0.95)) == "better"


def test_paired_summary_round_trips_through_json_and_renders_both_intervals():
    scores = [[1, 0, 1, 1], [1, 1, 1, 0], [0, 1, 1, 1]]
    baseline = [[0, 0, 1, 1], [1, 1, 0, 0], [0, 0, 1, 1]]
    entry = json.loads(json.dumps(paired_summary("minus_control", scores, baseline)))
    assert CI(**entry["minus_control"]) == pooled_bootstrap_ci(scores, baseline)
    assert CI(**entry["minus_control_over_seeds"]) == paired_seed_ci(scores, baseline)
    assert format_summary(entry, "minus_control") == format_paired(
        pooled_bootstrap_ci(scores, baseline), paired_seed_ci(scores, baseline))
    # a summary written before the seeds' interval existed, and a missing key
    old = {"minus_control": entry["minus_control"]}
    assert format_summary(old, "minus_control") == format_ci(CI(**entry["minus_control"]))
    assert format_summary(old, "minus_alone") == "-"


def test_format_paired_renders_both_intervals():
    items, seeds = CI(0.053, 0.022, 0.082, 1008, 0.95), CI(0.053, -0.008, 0.113, 3, 0.95)
    assert format_paired(items, seeds) == "5.3 [2.2, 8.2] (seeds [-0.8, 11.3])"
    one = CI(0.053, 0.053, 0.053, 1, 0.95, degenerate=True)
    assert format_paired(items, one) == "5.3 [2.2, 8.2] (seeds: n/a, one seed)"


# --- legal answers --------------------------------------------------------------------------


def test_legal_answer_cases():
    values = ["blue", "dark green", "St. Ives"]
    assert is_legal("Blue", values) and is_legal(" the blue ", values)
    assert is_legal("blue. The sky is blue", values) and is_legal("dark green,", values)
    assert is_legal("blue\nQ: next", values) and is_legal("st. ives", values)
    assert not is_legal("blue green", values) and not is_legal("bluer", values)
    assert not is_legal("I think blue", values) and not is_legal("", values)


def test_legal_answer_rate_shared_and_per_item_sets():
    assert legal_answer_rate(["blue", "red", "green.", "?"], ["blue", "green"]) == 0.5
    assert legal_answer_rate(["a", "b"], [["a"], ["c"]]) == 0.5
    with pytest.raises(ValueError, match="one list per item"):
        legal_answer_rate(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="no predictions"):
        legal_answer_rate([], ["a"])


# --- entity swap ----------------------------------------------------------------------------


def test_swap_entity_cases():
    assert swap_entity("Where was Alira Marrow born?", "Alira Marrow", "Tesh Vane") == \
        "Where was Tesh Vane born?"
    assert swap_entity("zenly makes what? Ask zenly.", "zenly", "quorb") == \
        "quorb makes what? Ask quorb."
    assert swap_entity("Zenly sells lamps; zenlyx and xzenly do not.", "zenly", "quorb") == \
        "Quorb sells lamps; zenlyx and xzenly do not."
    assert swap_entity("Under the CORVELL ACT and the Corvell  Act", "Corvell Act",
                       "Darrow Law") == "Under the DARROW LAW and the Darrow Law"
    assert swap_entity("the corvell act", "Corvell Act", "Darrow Law") == "the darrow law"
    assert swap_entity("Zenly's founder", "zenly", "quorb") == "Quorb's founder"
    with pytest.raises(ValueError, match="does not occur"):
        swap_entity("zenlyx is different", "zenly", "quorb")


def test_entity_swap_control_is_deterministic_and_consistent_per_entity():
    Item = namedtuple("Item", "question entity answer")  # any object with these attributes
    items = [Item("What does zenly sell?", "zenly", "lamps"),
             Item("Where is zenly based?", "zenly", "Oslo"),
             Item("Who founded Alira Marrow?", "Alira Marrow", "Bo")]
    names = ["quorb", "tesh", "zenly", "vane"]
    swapped = entity_swap_control(items, names, seed=1)
    assert swapped == entity_swap_control(items, names, seed=1)
    assert swapped[0].entity == swapped[1].entity != swapped[2].entity
    assert all(s.entity != "zenly" and s.entity in names for s in swapped)
    assert [s.answer for s in swapped] == ["lamps", "Oslo", "Bo"]
    assert swapped[0].question == f"What does {swapped[0].entity} sell?"
    assert isinstance(swapped[2], SwappedItem) and swapped[2].original == "Alira Marrow"
    by_kind = entity_swap_control(items, {"org": ["Acme"], "person": ["Tesh Vane"]},
                                  kind_of=lambda i: "person" if " " in i.entity else "org")
    assert [s.entity for s in by_kind] == ["Acme", "Acme", "Tesh Vane"]
    with pytest.raises(ValueError, match="no unseen"):
        entity_swap_control(items, ["zenly"])


# --- closed-set choice on a tiny trained model ----------------------------------------------

FACTS = [("the sky", "blue"), ("grass", "green"), ("blood", "red"), ("the sun", "yellow"),
         ("snow", "white"), ("coal", "black")]
PROMPTS = [f"Q: What colour is {thing}? A:" for thing, _ in FACTS]
COLOURS = [colour for _, colour in FACTS]


@pytest.fixture(scope="module")
def colour_models(one_thread):
    lines = [f"{p} {c}." for p, c in zip(PROMPTS, COLOURS)]
    tok = train_bpe_tokenizer(lines * 4, vocab_size=300)
    rng = random.Random(0)
    blocks = pack_corpus(tok, [rng.choice(lines) for _ in range(400)], seq_len=32)
    sizes = dict(vocab_size=len(tok), hidden_size=64, num_layers=2, num_heads=4)
    untrained = build_tiny("llama", seed=0, **sizes)
    trained = build_tiny("llama", seed=0, **sizes)
    train_lm(trained, blocks, steps=120, batch_size=16, lr=3e-3, warmup=10, progress=False)
    return tok, untrained, trained


def test_closed_set_choice_ranks_the_learned_value_first(colour_models):
    tok, untrained, trained = colour_models
    assert closed_set_choice(trained, tok, PROMPTS, COLOURS) == list(range(len(COLOURS)))
    result = closed_set_accuracy(trained, tok, PROMPTS, COLOURS, COLOURS)
    base = closed_set_accuracy(untrained, tok, PROMPTS, [COLOURS] * 6, list(range(6)))
    assert result.accuracy == 1.0 and result.chance_accuracy == pytest.approx(1 / 6)
    assert base.accuracy <= 1 / 3 < result.accuracy  # random weights do not know the facts
    with pytest.raises(ValueError, match="not one of the legal values"):
        closed_set_accuracy(trained, tok, PROMPTS[:1], COLOURS, ["purple"])
