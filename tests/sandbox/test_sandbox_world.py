"""The sandbox world: determinism, design invariants, and world -> files -> loaders."""

import random
import re
from collections import Counter

import pytest

from plasticlm.config import from_dict
from plasticlm.data import (
    CLIENT_DOMAINS,
    load_longbench,
    load_mmlu,
    load_squad,
    load_streams,
    load_text_corpus,
)
from plasticlm.errors import PlasticError
from plasticlm.eval import qa_prompt
from plasticlm.sandbox import (
    WORLD_CLIENT_DOMAIN,
    WorldConfig,
    generate_world,
    read_world_index,
    shuffle_statements,
    write_world,
)
from plasticlm.sandbox.world_index import question_meta

SMALL = WorldConfig(seed=5, core_per_domain=16, unseen_per_domain=4, specialist_entities=8,
                    drills=10, longbench_per_length=2, longbench_words=(200, 400, 800))


@pytest.fixture(scope="module")
def world():
    return generate_world(SMALL)


@pytest.fixture(scope="module")
def world_dir(world, tmp_path_factory):
    return write_world(world, tmp_path_factory.mktemp("world"))


def test_deterministic_from_seed(world):
    again = generate_world(SMALL)
    assert again.train_docs == world.train_docs and again.questions == world.questions
    other = generate_world(WorldConfig(**{**SMALL.__dict__, "seed": 6}))
    assert other.train_docs != world.train_docs


def test_five_domains_cover_the_fednl_clients(world):
    assert len(world.domains) >= 5
    assert sorted(WORLD_CLIENT_DOMAIN.values()) == sorted(CLIENT_DOMAINS)
    assert {d.client_domain for d in world.domains} == set(CLIENT_DOMAINS)
    # Each domain has its own entity names: no name is shared across domains.
    names = Counter(e.name for e in world.entities)
    assert max(names.values()) == 1


def test_zipf_mentions_and_buckets(world):
    corpus = "\n".join(world.train_docs)
    for d in world.domains:
        core = sorted((e for e in world.entities if e.domain == d.name and e.role == "core"),
                      key=lambda e: e.rank)
        mentions = [e.mentions for e in core]
        assert mentions == sorted(mentions, reverse=True) and mentions[0] > mentions[-1]
        assert core[0].bucket == "head" and core[-1].bucket == "tail"
        # The corpus really repeats head entities more than tail ones.
        def count(name):
            return len(re.findall(rf"(?<!\w){re.escape(name)}(?!\w)", corpus))
        assert count(core[0].name) > count(core[-1].name) >= 3 * SMALL.min_mentions


def test_roles_keep_their_secrets(world):
    train = "\n".join(world.train_docs + world.valid_docs)
    special = "\n".join(world.specialist_docs)
    domains = {d.name: d for d in world.domains}
    for e in world.entities:
        if e.role == "unseen":
            assert e.name not in train and e.name not in special
        elif e.role == "specialist":
            assert e.name not in train and e.name in special
            assert e.domain == SMALL.specialist_domain
        else:
            assert e.name in train
            # Held-out entities: their questions never appear as Q/A lines in the corpus.
            for a in domains[e.domain].attributes:
                assert (qa_prompt(a.question.format(e=e.name)) in train) == e.qa_in_corpus
        if e.role == "specialist":
            # The specialist reads Q/A lines for every private entity (closed attributes).
            for a in domains[e.domain].closed_attributes:
                assert qa_prompt(a.question.format(e=e.name)) in special


def test_questions_match_facts(world):
    facts = {f["id"]: f for f in world.facts()}
    assert len(world.question_facts) == len(world.questions) + len(world.specialist_questions)
    for q, meta in zip(world.questions + world.specialist_questions, world.question_facts):
        fact = facts[meta["fact"]]
        assert q.answer_text == fact["value"] and fact["entity"] in q.question
        assert len(set(q.choices)) == 4
        assert q.split in ("dev", "val", "test")
        if fact["role"] == "core":
            assert (q.split == "dev") == fact["qa_in_corpus"]
        assert meta["bucket"] == fact["bucket"]
    splits = Counter(q.split for q in world.questions)
    assert splits["dev"] and splits["val"] and splits["test"]
    assert Counter(q.answer for q in world.questions).keys() == set("ABCD")


def test_round_trip_through_the_loaders(world, world_dir):
    index = read_world_index(world_dir)
    assert len(index["facts"]) == len(world.facts())
    qs = [q for s in ("dev", "val", "test") for q in load_mmlu(world_dir / "mmlu", s)]
    assert sorted(qs, key=repr) == sorted(world.questions, key=repr)
    meta = question_meta(index)
    assert all((q.subject, q.split, q.index) in meta for q in qs)
    spec = load_mmlu(world_dir / "specialist_mmlu", "test")
    assert spec and {q.subject for q in spec} == {SMALL.specialist_domain}
    assert load_squad(world_dir / "squad" / "unseen.json") == world.passages
    assert load_longbench(world_dir / "longbench" / "items.json") == world.long_items
    assert load_streams(world_dir / "streams.jsonl") == world.streams
    assert [d.text for d in load_text_corpus(world_dir / "corpus" / "train.txt")] == \
        [d.strip() for d in world.train_docs]


def test_squad_passages_answer_with_short_spans(world):
    titles = {p.title for p in world.passages}
    for p in world.passages:
        assert len(p.qas) == 4          # three closed attributes and one open
        for qa in p.qas:
            a = qa.answers[0]
            assert p.context[a.start: a.start + len(a.text)] == a.text
            assert len(a.text.split()) <= 3
    for s in world.streams:
        assert set(s.items) <= titles and len(set(s.items)) == len(s.items)


def test_longbench_items_hold_their_answer(world):
    passages = {p.title: p for p in world.passages}
    for item in world.long_items:
        assert item.answer in "ABCD"
        name = next(t for t in passages if t in item.question)
        assert passages[name].context in item.context
        assert item.choices["ABCD".index(item.answer)] in passages[name].context
    words = {it.length: len(it.context.split()) for it in world.long_items}
    assert words["short"] >= 200 and words["long"] >= 800


def test_bad_config():
    with pytest.raises(PlasticError, match="specialist_domain: input should be 'pharmacology'"):
        from_dict(WorldConfig, {"specialist_domain": "astrology"})
    with pytest.raises(PlasticError, match="core_per_domain: .* greater than or equal to 8"):
        from_dict(WorldConfig, {"core_per_domain": 3})
    with pytest.raises(PlasticError, match="drill_words"):
        from_dict(WorldConfig, {"drill_words": [80, 36]})
    with pytest.raises(PlasticError, match="not a sandbox world folder"):
        read_world_index("/nonexistent")


def test_default_world_is_large_enough_for_held_out_claims():
    """v2 defaults: >= 400 specialist entities, >= 300 questions in each held-out split."""
    w = generate_world()
    spec = [e for e in w.entities if e.role == "specialist"]
    assert len(spec) >= 400
    splits = Counter(q.split for q in w.specialist_questions)
    assert splits["val"] + splits["test"] >= 300 and splits["dev"] >= 300
    assert len(w.passages) >= 200


def test_open_values_defeat_a_prior_over_values(world):
    """An open attribute's value is a name drawn per entity: no value covers more than a
    few entities, so answering without reading the entity cannot score."""
    w = generate_world()
    for d in w.domains:
        open_attr = [a for a in d.attributes if not a.closed]
        assert len(open_attr) == 1 and len(d.closed_attributes) == 3
        values = Counter(e.attributes[open_attr[0].name] for e in w.entities
                         if e.domain == d.name)
        assert values.most_common(1)[0][1] <= 3
        for a in d.closed_attributes:
            assert len(a.values) >= 8 and len(a.statements) == 6


def test_passages_vary_their_layout(world):
    w = generate_world()
    openings = Counter(p.context.split(". ")[0].replace(p.title, "E") for p in w.passages)
    # No single opening sentence shape dominates the passages.
    assert openings.most_common(1)[0][1] < 0.2 * len(w.passages)


def test_shuffled_biographies_keep_every_statement_and_multiline_documents_stay(world):
    rng = random.Random(0)
    names = [e.name for e in world.entities]
    moved = 0
    for doc in world.train_docs:
        out = shuffle_statements(doc, rng)
        if "\n" in doc:                       # Q/A blocks and retrieval drills
            assert out == doc
            continue
        parts, new = doc.split(". "), out.split(". ")
        assert sorted(p.rstrip(".") for p in parts) == sorted(p.rstrip(".") for p in new)
        # Every piece is a whole statement about the document's entity (no name cut apart).
        assert any(all(n in p for p in new) for n in names if n in doc)
        moved += out != doc
    assert moved > len(world.train_docs) // 3
