"""Loaders on the real files in ../shared/data, on written files, and on malformed files."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plasticlm.data import (
    QA,
    Answer,
    LongItem,
    MCQuestion,
    Passage,
    Stream,
    extract_answer,
    load_haystack,
    load_longbench,
    load_mmlu,
    load_squad,
    load_streams,
    load_text_corpus,
    mmlu_subjects,
    write_longbench,
    write_mmlu,
    write_squad,
    write_streams,
    write_text_corpus,
)
from plasticlm.errors import PlasticError


def test_real_mmlu(shared_data):
    folder = shared_data / "mmlu"
    assert len(mmlu_subjects(folder, "test")) == 57
    dev = load_mmlu(folder, "dev")
    assert len(dev) == 285 and {q.split for q in dev} == {"dev"}
    assert all(len(q.choices) == 4 and q.answer in "ABCD" for q in dev)
    first = load_mmlu(folder, "dev", ["abstract_algebra"])[0]
    assert first.question.startswith("Find all c in Z_3") and first.answer == "B"
    assert first.answer_text == "1"


def test_real_squad(shared_data):
    passages = load_squad(shared_data / "squad" / "xquad.en.json")
    assert len(passages) == 240
    assert sum(len(p.qas) for p in passages) == 1190
    for p in passages:
        for qa in p.qas:
            for a in qa.answers:
                assert p.context[a.start: a.start + len(a.text)] == a.text


def test_real_text_and_haystack(shared_data):
    stories = load_text_corpus(shared_data / "tinystories" / "tinystories_sample.txt")
    assert len(stories) > 1000
    assert all("<|endoftext|>" not in d.text and d.text for d in stories[:100])
    essays = load_haystack(shared_data / "haystack" / "paul_graham")
    assert len(essays) == 49 and sum(len(d.text.split()) for d in essays) > 100_000
    assert load_text_corpus(shared_data / "tinystories" / "tinystories_sample.txt", 5)[4] == \
        stories[4]


# Text that stresses CSV quoting: commas, quotes, newlines, unicode.
_field = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x00"),
                 min_size=1, max_size=30).filter(lambda s: s.strip() == s and s)


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.tuples(_field, _field, _field, _field, _field,
                               st.sampled_from("ABCD")), min_size=1, max_size=5))
def test_mmlu_round_trip(tmp_path_factory, rows):
    folder = tmp_path_factory.mktemp("mmlu")
    qs = [MCQuestion("sub_ject", "val", r[0], tuple(r[1:5]), r[5], i) for i, r in enumerate(rows)]
    write_mmlu(folder, qs)
    assert load_mmlu(folder, "val") == qs


@pytest.mark.parametrize("row, message", [
    ('q,a,b,c,A\n', "line 1: 5 columns"),
    ('q,a,b,c,d,A\nq2,a,b,c,d,E\n', "line 2: answer field 'E'"),
    ('q,a,b,c,d,A\n\n', "line 2: empty row"),
])
def test_mmlu_malformed(tmp_path, row, message):
    (tmp_path / "test").mkdir()
    path = tmp_path / "test" / "bad_test.csv"
    path.write_text(row)
    with pytest.raises(PlasticError, match=message) as e:
        load_mmlu(tmp_path, "test")
    assert "bad_test.csv" in str(e.value)


def test_mmlu_missing(tmp_path):
    with pytest.raises(PlasticError, match="no test/ folder"):
        load_mmlu(tmp_path, "test")
    (tmp_path / "test").mkdir()
    with pytest.raises(PlasticError, match="no subject 'x'"):
        load_mmlu(tmp_path, "test", ["x"])
    with pytest.raises(PlasticError, match="unknown MMLU split"):
        load_mmlu(tmp_path, "train")


def test_squad_round_trip(tmp_path):
    ctx = "Ada was born in Korvale. She wrote poems."
    p = [Passage("Ada", ctx, (QA("1", "Where?", (Answer("Korvale", ctx.index("Korvale")),)),)),
         Passage("Ada", "Second.", ()), Passage("Bo", "Bo is here.", ())]
    path = write_squad(tmp_path / "s.json", p)
    assert load_squad(path) == p
    assert [a["title"] for a in json.loads(path.read_text())["data"]] == ["Ada", "Bo"]


def _squad(qas_answers):
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": [
        {"context": "The cat sat.", "qas": [{"id": "q", "question": "Who?",
                                             "answers": qas_answers}]}]}]}


@pytest.mark.parametrize("doc, message", [
    (_squad([{"text": "cat", "answer_start": 0}]), r"answers\[0\]: answer_start 0 does not point"),
    (_squad([{"text": "cat"}]), r"answers\[0\]: missing field 'answer_start'"),
    (_squad([]), "answers: empty"),
    ({"version": "1.1"}, "missing field 'data'"),
])
def test_squad_malformed(tmp_path, doc, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlasticError, match=message) as e:
        load_squad(path)
    assert str(path) in str(e.value)


def test_squad_not_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"data": [\n  oops')
    with pytest.raises(PlasticError, match="line 2"):
        load_squad(path)


def test_longbench_round_trip_and_errors(tmp_path):
    items = [LongItem("a1", "law", "year", "easy", "short", "When?", ("1", "2", "3", "4"), "C",
                      "long text")]
    path = write_longbench(tmp_path / "lb.json", items)
    assert load_longbench(path) == items
    rows = json.loads(path.read_text())
    jl = tmp_path / "lb.jsonl"
    jl.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps({**rows[0], "answer": "E"}) + "\n")
    with pytest.raises(PlasticError, match=r"line 3\.answer: 'E'"):
        load_longbench(jl)
    del rows[0]["context"]
    path.write_text(json.dumps(rows))
    with pytest.raises(PlasticError, match=r"item \[0\]: missing field 'context'"):
        load_longbench(path)
    assert extract_answer("Thus, The correct answer is (B).") == "B"
    assert extract_answer("The correct answer is D") == "D"
    assert extract_answer("no idea") is None


def test_text_corpus_and_haystack_errors(tmp_path):
    path = write_text_corpus(tmp_path / "c.txt", ["one story.", "two\nlines."])
    assert [d.text for d in load_text_corpus(path)] == ["one story.", "two\nlines."]
    (tmp_path / "empty.txt").write_text("  <|endoftext|>\n")
    with pytest.raises(PlasticError, match="empty.txt: holds no text"):
        load_text_corpus(tmp_path / "empty.txt")
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9")
    with pytest.raises(PlasticError, match="latin.txt: not UTF-8"):
        load_text_corpus(tmp_path / "latin.txt")
    hay = tmp_path / "hay"
    hay.mkdir()
    with pytest.raises(PlasticError, match="holds no .txt files"):
        load_haystack(hay)
    (hay / "a.txt").write_text("An essay.")
    (hay / "b.txt").write_text("\n")
    with pytest.raises(PlasticError, match="b.txt is empty"):
        load_haystack(hay)


def test_streams_round_trip_and_errors(tmp_path):
    s = [Stream("s0", "squad", ["A", "B"]), Stream("s1", "squad", [])]
    path = write_streams(tmp_path / "s.jsonl", s)
    assert load_streams(path) == s
    path.write_text('{"id": "x", "kind": "squad"}\n')
    with pytest.raises(PlasticError, match="line 1: field 'items'"):
        load_streams(path)


def test_mmlu_hub_gives_a_clear_error_offline(monkeypatch):
    from plasticlm.data import load_mmlu_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(PlasticError, match="datasets|could not fetch cais/mmlu"):
        load_mmlu_hub("dev", ["anatomy"])
