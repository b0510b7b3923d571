"""Sandbox v3: reading documents in pre-training, the v3 presets, resumable mixed batches,
the reading probes, and a small model that learns to read only when reading documents are
in its recipe."""

import json
import random
import re
from dataclasses import replace

import pytest
import torch

from plasticlm.data.niah import haystack_sentences
from plasticlm.eval import closed_set_accuracy
from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.models.pretrain import masked_lm_loss, packed_segment_batch, train_lm_segments
from plasticlm.sandbox import get_preset, preset_dir, pretrain_preset
from plasticlm.sandbox.pretrain import member_key
from plasticlm.sandbox.reading import (
    KINDS_OF_READING,
    ReadingMix,
    closed_book_pairs,
    document_drawer,
    reading_document,
)
from plasticlm.sandbox.reading_probes import READING_PROBES, _entity_items, _entry
from plasticlm.sandbox.shipped import shipped_keys
from plasticlm.sandbox.world import WorldConfig, generate_world

SMALL = WorldConfig(seed=0, core_per_domain=8, unseen_per_domain=4, specialist_entities=8,
                    max_mentions=3, drills=6, longbench_per_length=1,
                    longbench_words=(120, 200, 300), streams=1, stream_length=3)


@pytest.fixture(scope="module")
def world():
    return generate_world(SMALL)


@pytest.fixture(scope="module")
def tok(world):
    return train_bpe_tokenizer(world.train_docs + world.valid_docs, vocab_size=400)


def test_v3_preset_reads_in_every_member_and_v2_stays_the_default():
    p = get_preset("sandbox-v3")
    receiver = next(m for m in p.models if m.name == "receiver")
    assert receiver.num_layers >= 16
    assert {m.name for m in p.models} == {"receiver", "transmitter-llama", "transmitter-qwen2",
                                          "specialist"}
    for m in p.models:
        key = json.loads(member_key(p, m))
        assert key["spec"]["reading_share"] > 0, m.name
        assert {k for k, w in key["reading"]["kinds"] if w > 0} == set(KINDS_OF_READING)
        assert key["reading"]["closed_book_share"] > 0
        # the answers outweigh the world's tokens in the loss: at weight 1 reading never
        # started beside the world corpus (row r4), at 0.25 it did (r7, docs/sandbox.md)
        assert 0 < key["reading"]["world_weight"] < 1
    assert preset_dir("sandbox-v3").name == "sandbox-v3"
    assert preset_dir("sandbox").name == "sandbox-v2"
    # v2's definition is untouched: its shipped family still matches its keys.
    v2 = get_preset("sandbox")
    assert shipped_keys("sandbox") == {m.name: member_key(v2, m) for m in v2.models}


def test_reading_documents_are_fresh_and_answered_by_their_context(world, tok):
    sentences = haystack_sentences(world.train_docs)
    names = {e.name for e in world.entities}
    closed = closed_book_pairs(world)
    for kind in ("openbook", "distractors", "stated"):
        mix = ReadingMix(kinds=((kind, 1.0),), closed_book_share=0.0)
        for i in range(20):
            segs = reading_document(world, mix, random.Random(i), sentences, tok, closed)
            context = "".join(s.text for s in segs if not s.answer)
            answers = [s.text for s in segs if s.answer]
            assert answers and all(a.strip() in context for a in answers), (kind, segs)
            asked = [s.text for s in segs if s.text.startswith("Q: ")]
            # about no world entity (an answer may be one: a birthplace is a world town)
            assert asked and not any(n in q.split(" A:")[0] for q in asked for n in names)
    a, b = (reading_document(world, ReadingMix(), random.Random(7), sentences, tok, closed)
            for _ in range(2))
    assert a == b          # a function of the rng alone: a resumed run draws the same


def test_a_passage_of_one_attribute_states_only_what_is_asked(world, tok):
    mix = ReadingMix(kinds=(("openbook", 1.0),), closed_book_share=0.0, passage_attributes=1,
                     filler_words=(0, 0), questions=(3, 3))
    for i in range(20):
        segs = reading_document(world, mix, random.Random(i), [], tok, [])
        asked = {s.text for s in segs if s.text.startswith("Q: ")}
        answer = next(s.text.strip() for s in segs if s.answer)
        assert len(asked) == 1                       # the one attribute stated
        assert segs[0].text.count(answer) == 3       # its statement and two paraphrases


def test_needle_documents_fit_a_coarse_tokenizer(world):
    """A tokenizer that spends more tokens per word than the needle range allows for still
    gets needle documents (longer ones): the v3 build's bpe768 members stopped at the first
    multi-key document with 177 tokens."""
    coarse = train_bpe_tokenizer(world.train_docs, vocab_size=280)
    mix = ReadingMix(kinds=(("multikey", 1.0), ("vartrack", 1.0)), needle_tokens=(100, 120),
                     closed_book_share=0.0)
    for i in range(6):
        segs = reading_document(world, mix, random.Random(i), haystack_sentences(
            world.train_docs), coarse, [])
        assert segs[0].text.endswith("Answer:") and segs[1].answer


def test_needle_documents_ask_every_key_and_chain_their_context_states(world, tok):
    """``needle_questions`` asks a multi-key haystack for its other keys' values too, and a
    variable-tracking one for its decoy chain; every answer is in the context."""
    hay = haystack_sentences(world.train_docs)
    for kind, most in (("multikey", 4), ("vartrack", 2)):
        mix = ReadingMix(kinds=((kind, 1.0),), needle_tokens=(200, 260), closed_book_share=0.0,
                         needle_questions=8)
        for i in range(4):
            segs = reading_document(world, mix, random.Random(i), hay, tok, [])
            answers = [x.text.strip(" .") for x in segs if x.answer]
            assert len(answers) == most and len(set(answers)) == most, (kind, answers)
            context = segs[0].text
            for a in answers:
                if kind == "multikey":
                    assert f"is: {a}." in context
                else:
                    chain = a.split(", ")
                    assert all(f"VAR {y} = VAR {x}." in context for x, y in zip(chain, chain[1:]))
                    assert re.search(rf"VAR {chain[0]} = \d+\.", context)
        one = replace(mix, needle_questions=1)
        assert sum(x.answer for x in reading_document(world, one, random.Random(0), hay, tok,
                                                       [])) == 1


def test_closed_book_questions_come_only_from_q_a_entities(world):
    dev = {e.name for e in world.entities if e.role == "core" and e.qa_in_corpus}
    held = {e.name for e in world.entities if e.role == "core" and not e.qa_in_corpus}
    pairs = closed_book_pairs(world)
    assert pairs and all(any(n in q for n in dev) for q, _ in pairs)
    assert not any(n in q for q, _ in pairs for n in held)


def test_packed_segments_put_the_loss_on_answers(world, tok):
    def draw(rng):
        return [("Q: Who? A:", False), (" Lena Marrow", True), (".\n", False)]

    ids, in_loss = packed_segment_batch(tok, draw, 2, 40, random.Random(0))
    assert ids.shape == in_loss.shape == (2, 41)
    answer = tok(" Lena Marrow", add_special_tokens=False)["input_ids"]
    marked = ids[in_loss & (ids != tok.bos_token_id) & (ids != tok.eos_token_id)].tolist()
    assert marked and set(marked) <= set(answer)


def test_packed_segments_keep_each_answer_in_view_of_its_document(world, tok):
    """Rows start at a document's start and hold whole documents (the last one cut at the
    row's end), so every loss target sees its document from the BOS on: a stream cut into
    rows left 89% of open-book answers without their passage at 256 tokens (docs/sandbox.md)."""
    def draw(rng):
        passage = " ".join(rng.choice(["Lena", "Marrow", "river", "town"]) for _ in range(12))
        return [(passage + "\nQ: Who? A:", False), (" Lena Marrow", True), (".\n", False)]

    for seed in range(5):
        ids, in_loss = packed_segment_batch(tok, draw, 4, 40, random.Random(seed))
        assert ids.shape == in_loss.shape == (4, 41)
        for row, mask in zip(ids.tolist(), in_loss.tolist()):
            assert row[0] == tok.bos_token_id
            for t, (x, m) in enumerate(zip(row, mask)):
                if m and x not in (tok.bos_token_id, tok.eos_token_id):
                    start = max(i for i in range(t) if row[i] == tok.bos_token_id)
                    assert "Q: Who? A:" in tok.decode(row[start:t]), (seed, t)


def test_world_weight_weighs_the_world_documents_in_the_loss(world, tok):
    """``ReadingMix.world_weight`` gives each world-corpus token that weight against an
    answer token's 1 (row r7, docs/sandbox.md); at 1 the batches are the bool masks of before."""
    hay = haystack_sentences(world.train_docs)
    mix = ReadingMix(share=0.5, kinds=(("stated", 1.0),), context_loss=False)
    plain = packed_segment_batch(tok, lambda r: document_drawer(world, mix, hay, tok)(r, 0),
                                 4, 64, random.Random(0))
    heavy = replace(mix, world_weight=0.25)
    ids, w = packed_segment_batch(tok, lambda r: document_drawer(world, heavy, hay, tok)(r, 0),
                                  4, 64, random.Random(0))
    assert plain[1].dtype == torch.bool and w.dtype == torch.float32
    assert torch.equal(ids, plain[0]) and torch.equal(w > 0, plain[1])
    assert {round(x, 4) for x in w.unique().tolist()} == {0.0, 0.25, 1.0}
    # answers (weight 1) are never world text: they sit between a question and ".\n"
    model = build_tiny("qwen3", seed=0, vocab_size=len(tok), hidden_size=16, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=32)
    with torch.no_grad():
        assert masked_lm_loss(model, ids, w > 0).item() == pytest.approx(
            masked_lm_loss(model, ids, (w > 0).float()).item(), rel=1e-5)
        assert masked_lm_loss(model, ids, w).item() != pytest.approx(
            masked_lm_loss(model, ids, w > 0).item(), rel=1e-5)
    with pytest.raises(ValueError):
        ReadingMix(world_weight=0.0)


class Interrupt(Exception):
    pass


def test_mixed_pre_training_resumes_to_the_same_weights(world, tok, tmp_path):
    draw = document_drawer(world, ReadingMix(needle_tokens=(200, 260), warmup_steps=3),
                           haystack_sentences(world.train_docs), tok)

    draws = []

    def run(folder=None, stop_at=None):
        model = build_tiny("qwen3", seed=0, vocab_size=len(tok), hidden_size=16, num_layers=2,
                           num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=32)
        seen = []

        def stopping(rng, step):
            if stop_at is not None and len(seen) >= stop_at:
                raise Interrupt
            seen.append(1)
            return draw(rng, step)

        losses = train_lm_segments(model, tok, stopping, 12, 32, batch_size=2, lr=1e-2,
                                   warmup=2, progress=False, checkpoint=folder,
                                   checkpoint_every=4, checkpoint_key="t")
        draws.append(len(seen))
        return model, losses

    full, full_losses = run()
    with pytest.raises(Interrupt):
        run(tmp_path / "ck", stop_at=draws[0] * 2 // 3)   # after a checkpoint, mid-run
    resumed, losses = run(tmp_path / "ck")
    assert losses == pytest.approx(full_losses, abs=1e-5)
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.slow
def test_quick_v3_preset_reports_every_reading_probe(tmp_path):
    report = pretrain_preset("quick-v3", tmp_path, progress=False)
    assert report["sandbox_version"] == 3
    for name, m in report["models"].items():
        assert set(m["reading"]) == set(READING_PROBES), name
        for e in m["reading"].values():
            assert 0 <= e["low"] <= e["accuracy"] <= e["high"] <= 1 and e["n"] >= 8
    table = (tmp_path / "probes.md").read_text()
    assert "variable tracking" in table and "answer stated (T2T)" in table


def test_reading_probes_ask_what_their_context_states(world):
    """Every entity probe's right choice is stated in its context (and the question is about
    an unseen entity); distractor items hold three passages."""
    unseen = {e.name for e in world.entities if e.role == "unseen"}
    for probe in ("heldout_phrasing", "stated", "distractors"):
        for prompt, choices, answer, _ in _entity_items(world, probe, 20, (0, 10), 0):
            context, question = prompt.rsplit("\n", 1)
            assert question.startswith("Q: ") and question.endswith(" A:")
            assert any(n in question for n in unseen)
            assert choices[answer] in context, (probe, prompt, choices)
            if probe == "distractors":
                assert context.count("\n") == 2


def _stated_accuracy(model, tok, world, n: int = 60) -> dict:
    items = _entity_items(world, "stated", n, (0, 0), 0)
    res = closed_set_accuracy(model, tok, [p for p, *_ in items], [c for _, c, *_ in items],
                              [a for _, _, a, _ in items], batch_size=16)
    return _entry(list(res.correct), [g for *_, g in items])


@pytest.mark.slow
def test_small_model_learns_to_read_only_with_reading_documents(world, tok):
    """The recipe's reading documents are what teach reading: a small model pre-trained
    with the v3 curriculum's first phase (dense ``stated`` documents) copies a stated answer
    (the T2T form) about unseen entities; the same model and budget on the world corpus
    alone does not (this test's reading arm, measured before the whole-document packing of
    023e59f: 38% at 600 steps, 78% at 900, 88% at 1,300; stated documents are about 43
    tokens, so packing changes them little, and the test passed after it; about 3 minutes an
    arm on 2 cores)."""
    sentences = haystack_sentences(world.train_docs)
    scores = {}
    for share in (1.0, 0.0):
        model = build_tiny("qwen3", seed=0, vocab_size=len(tok), hidden_size=64, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=256)
        mix = ReadingMix(share=share, kinds=(("stated", 1.0),), closed_book_share=0.0)
        train_lm_segments(model, tok, document_drawer(world, mix, sentences, tok), 1500, 128,
                          batch_size=16, lr=3e-3, warmup=50, progress=False)
        scores[share] = _stated_accuracy(model, tok, world)
    assert scores[1.0]["low"] > 0.7, scores
    assert scores[0.0]["accuracy"] < 0.5, scores
