"""Model-free metrics of plasticlm.eval on hand-made cases and hypothesis properties."""

import math
import re
import string
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plasticlm.errors import PlasticError
from plasticlm.eval import (
    answer_index,
    bucket_means,
    cut_at_stop,
    exact_match,
    extract_choice,
    f1_score,
    mmlu_prompt,
    niah_accuracy,
    niah_score,
    normalize_answer,
    pad_batch,
    squad_metrics,
    squad_metrics_for,
    squad_score,
    streaming_ce,
    streaming_ce_from_losses,
    windows,
)

# ---- SQuAD -------------------------------------------------------------------------------


def _official_normalize(s):
    """The SQuAD v1.1 evaluation script's normalize_answer, transcribed as the reference."""
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def _official_f1(prediction, ground_truth):
    pred, gold = _official_normalize(prediction).split(), _official_normalize(ground_truth).split()
    common = Counter(pred) & Counter(gold)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision, recall = num_same / len(pred), num_same / len(gold)
    return (2 * precision * recall) / (precision + recall)


def test_normalize_answer_hand_cases():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("Theory of the Universe.") == "theory of universe"
    assert normalize_answer("  ") == ""


def test_exact_match_and_f1_hand_cases():
    assert exact_match("The Eiffel Tower", "eiffel tower.") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert f1_score("the cat sat", "cat sat on mat") == pytest.approx(2 / 3)
    assert f1_score("dog", "cat") == 0.0
    assert f1_score("a a b", "a b b") == pytest.approx(2 / 3)  # articles dropped: [b] vs [b, b]
    assert f1_score("b b c", "b c c") == pytest.approx(2 / 3)
    em, f1 = squad_score("Denver Broncos", ["Broncos", "Denver Broncos", "the Broncos"])
    assert (em, f1) == (1.0, 1.0)
    em, f1 = squad_score("Denver", ["Denver Broncos", "Broncos"])
    assert em == 0.0 and f1 == pytest.approx(2 / 3)


def test_f1_article_only_strings():
    # both normalise to nothing: EM says equal, so F1 must agree (v2 script convention)
    assert exact_match("the", "a") == 1.0 and f1_score("the", "a") == 1.0
    assert f1_score("the", "cat") == 0.0


def test_squad_metrics_means_and_duck_typing():
    res = squad_metrics(["Paris", "blue sky", "x"], [["Paris"], ["the sky"], ["y", "z"]])
    assert res.n == 3
    assert res.exact_match == pytest.approx(1 / 3)
    assert res.f1 == pytest.approx((1 + 2 / 3 + 0) / 3)

    class Rec:
        def __init__(self, answers):
            self.answers = answers

    items = [Rec([{"text": "Paris", "answer_start": 0}]), Rec(["the sky"]), Rec([{"text": "y"}])]
    assert squad_metrics_for(items, ["Paris", "blue sky", "x"]) == res
    with pytest.raises(PlasticError):
        squad_metrics(["a"], [])
    with pytest.raises(PlasticError):
        squad_score("a", [])


words = st.sampled_from(["a", "an", "the", "The", "cat", "sat", "b", "c", "b,", "x!", "'", "-"])
texts = st.lists(words, max_size=8).map(" ".join)


@given(texts, texts)
def test_f1_symmetric_and_bounded(a, b):
    f = f1_score(a, b)
    assert 0.0 <= f <= 1.0
    assert f == pytest.approx(f1_score(b, a))


@given(texts, texts)
def test_em_implies_f1_one(a, b):
    if exact_match(a, b) == 1.0:
        assert f1_score(a, b) == 1.0


@given(st.text(max_size=40))
def test_normalisation_idempotent_and_matches_official(s):
    n = normalize_answer(s)
    assert normalize_answer(n) == n
    assert n == _official_normalize(s)


@given(texts, texts)
def test_f1_matches_official_when_both_non_empty(a, b):
    if normalize_answer(a) and normalize_answer(b):
        assert f1_score(a, b) == pytest.approx(_official_f1(a, b))


# ---- NIAH --------------------------------------------------------------------------------


def test_niah_contains_and_exact():
    resp = "The special magic numbers are 1234567, 42 and 7654321."
    assert niah_score(resp, ["1234567", "7654321"]) == 1.0
    assert niah_score(resp, ["1234567", "999"]) == 0.5
    assert niah_score(resp, "123") == 1.0  # substring counts in contains mode
    assert niah_score(resp, "123", mode="exact") == 0.0
    assert niah_score(resp, ["42", "7654321"], mode="exact") == 1.0
    assert niah_score("UUID: 3F2504E0-4F89-11D3", "3f2504e0-4f89-11d3", mode="exact") == 1.0
    assert niah_score("it is in new york city", "New York", mode="exact") == 1.0
    assert niah_score("it is in newyork", "New York", mode="exact") == 0.0
    assert niah_accuracy(["a 1", "b"], [["1", "2"], ["b"]]) == pytest.approx(0.75)
    with pytest.raises(PlasticError):
        niah_score("x", "x", mode="fuzzy")
    with pytest.raises(PlasticError):
        niah_accuracy(["x"], [])


@given(st.lists(st.text(alphabet="abc123", min_size=1, max_size=6), min_size=1, max_size=5))
def test_niah_all_values_listed_are_found(values):
    resp = ", ".join(values)
    assert niah_score(resp, values, mode="exact") == 1.0
    assert niah_score(resp, values, mode="contains") == 1.0


# ---- streaming CE ------------------------------------------------------------------------


@settings(deadline=None)
@given(st.floats(1e-3, 100.0), st.integers(1, 50), st.integers(1, 10), st.integers(0, 49))
def test_constant_loss_stream_is_one_everywhere(c, bucket, nbuckets, extra):
    length = bucket * nbuckets + extra % bucket + 1  # ids; losses are one fewer
    res = streaming_ce(lambda ids: torch.full((ids.numel() - 1,), c), [list(range(length))],
                       bucket)
    assert len(res.normalised) == nbuckets
    assert res.normalised == pytest.approx([1.0] * nbuckets)
    assert res.relative_change == pytest.approx(0.0, abs=1e-12)


@given(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=60), st.integers(1, 7))
def test_bucket_means_match_loop_reference(losses, bucket):
    got = bucket_means(torch.tensor(losses, dtype=torch.float64), bucket).tolist()
    ref = [sum(losses[i : i + bucket]) / bucket
           for i in range(0, len(losses) - bucket + 1, bucket)]
    assert got == pytest.approx(ref)


def test_streaming_ce_hand_case_and_ragged_streams():
    a = torch.tensor([2.0, 2.0, 1.0, 1.0, 3.0, 3.0, 9.0])  # buckets of 2: 2, 1, 3 (9 dropped)
    b = torch.tensor([4.0, 4.0, 3.0, 3.0])                 # buckets: 4, 3
    res = streaming_ce_from_losses([a, b], bucket_size=2)
    assert res.mean_ce == pytest.approx([3.0, 2.0, 3.0])
    assert res.normalised == pytest.approx([1.0, 2 / 3, 1.0])
    assert res.num_streams == [2, 2, 1]
    assert res.bucket_starts == [1, 3, 5]
    with pytest.raises(PlasticError):
        streaming_ce_from_losses([a], bucket_size=10)
    with pytest.raises(PlasticError):
        streaming_ce(lambda ids: torch.ones(ids.numel()), [list(range(5))], 2)
    with pytest.raises(PlasticError):
        streaming_ce_from_losses([torch.zeros(4)], 2)


# ---- multiple-choice helpers -------------------------------------------------------------


def test_extract_choice():
    assert extract_choice("The correct answer is (C).") == 2
    assert extract_choice("I think the answer is B because") == 1
    assert extract_choice(" D") == 3
    assert extract_choice("(A) Paris") == 0
    assert extract_choice("B.") == 1
    assert extract_choice("A dog ran away") == 0  # a leading bare letter is taken as the choice
    assert extract_choice("Once upon a time") is None
    assert extract_choice("The correct answer is E") is None  # only A-D with 4 choices
    assert extract_choice("The correct answer is E", num_choices=5) == 4
    assert extract_choice("Answers vary") is None


def test_answer_index_and_prompt():
    assert answer_index("B", 4) == 1 and answer_index(" c ", 4) == 2 and answer_index(3, 4) == 3
    for bad in ("E", 4, -1, "AB", True, 1.0):
        with pytest.raises(PlasticError):
            answer_index(bad, 4)
    p = mmlu_prompt("What is 2+2?", ["3", "4", "5", "6"], subject="elementary_mathematics")
    assert p == ("The following are multiple choice questions (with answers) about elementary "
                 "mathematics.\n\nWhat is 2+2?\nA. 3\nB. 4\nC. 5\nD. 6\nAnswer:")
    with pytest.raises(PlasticError):
        mmlu_prompt("q", ["only one"])


def test_cut_at_stop():
    assert cut_at_stop("B\nQuestion: next", ("\n",)) == "B"
    assert cut_at_stop("abc", ("x", "")) == "abc"
    assert cut_at_stop("a.b;c", (";", ".")) == "a"


# ---- padding and windows -----------------------------------------------------------------


def test_pad_batch_both_sides():
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=0, side="right")
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=0, side="left")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(PlasticError):
        pad_batch([[1]], 0, side="middle")
    with pytest.raises(PlasticError):
        pad_batch([[1], []], 0)


@given(st.lists(st.integers(0, 9), min_size=2, max_size=80), st.integers(2, 20))
def test_windows_predict_every_token_once(ids, max_length):
    ws = windows(ids, max_length)
    assert all(2 <= len(w) <= max_length for w in ws)
    assert [t for w in ws for t in w[1:]] == ids[1:]
    assert math.isclose(sum(len(w) - 1 for w in ws), len(ids) - 1)
