"""Open-book items, client streams and long items: the evidence is in the context, far from
the question, and every question is asked only after its evidence."""

import pytest

from plasticlm.errors import PlasticError
from plasticlm.eval.prompts import context_prompt
from plasticlm.sandbox import (
    WorldConfig,
    client_stream,
    generate_world,
    load_client_streams,
    load_openbook,
    long_items,
    openbook_items,
    write_world_tasks,
)

SMALL = WorldConfig(seed=3, core_per_domain=8, unseen_per_domain=6, specialist_entities=8,
                    drills=4, longbench_per_length=1, longbench_words=(100, 200, 300))


@pytest.fixture(scope="module")
def world():
    return generate_world(SMALL)


def test_openbook_items_hold_their_evidence_before_the_filler(world):
    items = openbook_items(world, filler_words=(50, 60), seed=1)
    assert len(items) == 5 * 6 * 4           # domains x unseen entities x attributes
    for it in items:
        right = it.choices[it.answer]
        passage, _, filler = it.context.partition("\n")
        assert right in passage and it.entity in passage and right not in filler
        assert len(filler.split()) >= 50 and it.entity in it.question
        assert context_prompt(it.context, it.question).endswith(f"Q: {it.question} A:")
        assert len(set(it.choices)) == 4
    assert {it.closed for it in items} == {True, False}
    assert openbook_items(world, filler_words=(50, 60), seed=1) == items


def test_client_stream_asks_only_after_the_evidence(world):
    segs = client_stream(world, "law", min_lag=2, questions_per_passage=1.5, seed=0)
    seen: list[str] = []
    questions = 0
    for s in segs:
        if s.kind == "text":
            seen.append(s.entity)
        else:
            questions += 1
            assert s.entity in seen and s.lag >= 2
            assert seen[-1 - s.lag] == s.entity
            assert s.answer in s.choices and len(s.choices) == 4
    assert len(seen) == 6 and questions > 0
    with pytest.raises(PlasticError, match="no unseen entities"):
        client_stream(world, "astronomy")


def test_tasks_round_trip(world, tmp_path):
    write_world_tasks(world, tmp_path, seed=0)
    items = load_openbook(tmp_path / "openbook" / "items.jsonl")
    assert items == openbook_items(world, seed=0)
    streams = load_client_streams(tmp_path / "client_streams.jsonl")
    assert set(streams) == {d.name for d in world.domains}
    assert streams["law"] == client_stream(world, "law", seed=3)
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n')
    with pytest.raises(PlasticError, match="line 1"):
        load_openbook(tmp_path / "bad.jsonl")


def test_long_items_hide_their_evidence_at_each_length(world):
    """Any number of items per regime from the same world: each holds its entity's whole
    passage, which states the right choice; the other choices are other legal values of the
    attribute; every regime reaches its word count; the same seed draws the same items."""
    items = long_items(world, 5, seed=2)
    assert [it.length for it in items] == ["short"] * 5 + ["medium"] * 5 + ["long"] * 5
    passages = {p.title: p.context for p in world.passages}
    target = dict(zip(("short", "medium", "long"), world.config.longbench_words))
    for it in items:
        name = next(t for t in passages if t in it.question)
        right = it.choices["ABCD".index(it.answer)]
        assert passages[name] in it.context and right in passages[name]
        attribute = next(a for a in world.domain(it.domain).attributes if a.name == it.sub_domain)
        assert attribute.closed and set(it.choices) <= set(attribute.values)
        assert len(set(it.choices)) == 4
        assert len(it.context.split()) >= target[it.length]
    assert long_items(world, 5, seed=2) == items and long_items(world, 5, seed=3) != items
    with pytest.raises(PlasticError, match="per_length"):
        long_items(world, 0)
