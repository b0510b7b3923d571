"""The FedRefine ladder's rungs on a tiny fixture: the oracle's cache handed over untouched
(rung b) carries its facts to the receiver and needs RoPE re-rotation; an untrained fuser
(rung a) is the receiver alone; the cache objective closes the gap to a teacher's cache on
prompts it never saw; and the ladder experiment writes every rung beside its control."""

import copy
import json
import random
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import plasticlm.refine.fusers.fuser as fuser_module
from plasticlm.errors import PlasticError
from plasticlm.experiments.refine.rungs import LABELS, handover_fuser, zero_fuser
from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.refine import Example, FedRefine, FuserTrainConfig, KVCache, KVLayout, Link, Peer
from plasticlm.refine.cache import stack_caches
from plasticlm.refine.fusers.objectives import cache_gap
from plasticlm.refine.fusers.prepared import fused_batch_state, prepare_examples
from plasticlm.refine.fusers.train import train_fusers
from plasticlm.refine.modes import alone_state
from plasticlm.sandbox import teach_facts

ORGANS = ["liver", "heart", "lung", "kidney", "brain", "skin"]
SYLLABLES = ["ka", "lo", "mi", "zu", "ren", "tor", "vex", "pa", "qui", "dol", "sar", "nim"]
SHAPE = dict(hidden_size=32, num_layers=4, num_heads=2, num_kv_heads=1, head_dim=16,
             intermediate_size=64)

# Tiny models on a shared CPU: one intra-op thread is much faster than two.
pytestmark = pytest.mark.usefixtures("one_thread")


def _question(name: str) -> str:
    # tokens follow the name: C2C leaves the last prompt token unfused, so what the hand-over
    # carries must sit in the cache at " act on? A"
    return f"Q: Which organ does {name} act on? A:"


@pytest.fixture(scope="module")
def trio():
    """A Qwen3 receiver drilled on 200 entities' organs (so it reads an entity's organ from
    its representation, not by rote at the last token), the ORACLE (a copy of it taught 48
    other entities' facts, so its cache fits the receiver) and those 48 facts."""
    rng = random.Random(0)
    names = sorted({"".join(rng.choice(SYLLABLES) for _ in range(3)).capitalize()
                    for _ in range(1500)})
    rng.shuffle(names)
    facts = {n: ORGANS[i % len(ORGANS)] for i, n in enumerate(names[:48])}
    others = {n: random.Random(n).choice(ORGANS) for n in names[48:248]}
    tok = train_bpe_tokenizer([f"{_question(n)} {v}." for n, v in {**facts, **others}.items()]
                              * 3, vocab_size=300)
    receiver = build_tiny("qwen3", seed=0, vocab_size=len(tok), **SHAPE)
    teach_facts(receiver, tok, [(_question(n), " " + v) for n, v in others.items()], steps=600,
                lr=1e-2, progress=False)
    oracle = copy.deepcopy(receiver)
    teach_facts(oracle, tok, [(_question(n), " " + v) for n, v in facts.items()], steps=150,
                lr=1e-2, progress=False)
    return Peer("receiver", receiver, tok), Peer("oracle", oracle, tok), facts


def _choices(name: str, right: str) -> list[str]:
    r = random.Random(name)
    out = [right, *r.sample([o for o in ORGANS if o != right], 3)]
    r.shuffle(out)
    return out


def _hits(fr: FedRefine, facts: dict[str, str], mode: str) -> list[bool]:
    return [fr.score(_question(n), _choices(n, v), mode).choice == _choices(n, v).index(v)
            for n, v in facts.items()]


def _accuracy(fr: FedRefine, facts: dict[str, str], mode: str) -> float:
    hits = _hits(fr, facts, mode)
    return sum(hits) / len(hits)


def test_handover_carries_the_oracles_facts_and_needs_re_rotation(trio, monkeypatch):
    """Rung b: the receiver reading the oracle's cache (fused cache == the oracle's) answers
    far better than alone; the receiver's own cache handed over is alone; with the keys left
    de-rotated (``rotate`` removed) the gain mostly goes."""
    receiver, oracle, facts = trio
    handover = FedRefine(receiver, [Link(oracle, handover_fuser(receiver, oracle))])
    prompt = _question(next(iter(facts)))
    fused = handover.prepare(prompt, "c2c").cache
    own = alone_state(oracle, prompt).cache
    for got, want in zip(fused.keys + fused.values, own.keys + own.values):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    alone = _accuracy(FedRefine(receiver), facts, "alone")
    knows = _accuracy(FedRefine(oracle), facts, "alone")
    ceiling = _accuracy(handover, facts, "c2c")
    itself = FedRefine(receiver, [Link(receiver, handover_fuser(receiver, receiver))])
    assert _hits(itself, facts, "c2c") == _hits(FedRefine(receiver), facts, "alone")
    monkeypatch.setattr(fuser_module, "rotate", lambda keys, *args, **kw: keys)
    unrotated = _accuracy(handover, facts, "c2c")
    # measured (n = 48): alone 15%, oracle alone 100%, hand-over 71%, without re-rotation 42%
    assert knows >= 0.9, knows
    assert ceiling >= alone + 0.25, (alone, ceiling)
    assert unrotated <= ceiling - 0.15, (ceiling, unrotated)


def test_zero_rung_is_the_receiver_alone(trio):
    """Rung a: an untrained fuser from the oracle leaves the receiver's cache as it is (to
    1e-6) and every answer as alone's."""
    receiver, oracle, facts = trio
    fr = FedRefine(receiver, [Link(oracle, zero_fuser(receiver, oracle))])
    for n, v in list(facts.items())[:12]:
        fused = fr.prepare(_question(n), "c2c").cache
        own = alone_state(receiver, _question(n)).cache
        for got, want in zip(fused.keys + fused.values, own.keys + own.values):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        assert fr.score(_question(n), _choices(n, v), "c2c").scores == pytest.approx(
            fr.score(_question(n), _choices(n, v), "alone").scores, abs=1e-6)
    assert _hits(fr, facts, "c2c") == _hits(fr, facts, "alone")


def _caches(seed: int, batch: int, layers: int, length: int, pads: list[int]):
    """Three random caches [batch, 2 heads, length, 4] per layer, row i left-padded by
    ``pads[i]`` (one mask, as stacked caches share it)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    for i, p in enumerate(pads):
        mask[i, : min(p, length - 1)] = 0
    mask[0, 0] = 0    # some padding in every draw
    layout = KVLayout("qwen3", layers, 2, 4, torch.ones(2))

    def one() -> KVCache:
        def rand():
            return [torch.randn(batch, 2, length, 4, generator=g, dtype=torch.float64)
                    for _ in range(layers)]
        return KVCache(layout, rand(), rand(), torch.zeros(batch, length, dtype=torch.long),
                       torch.zeros(batch, length, dtype=torch.long), mask)
    return one(), one(), one()


def _scaled(c: KVCache, by: float, padding: float = 0.0) -> KVCache:
    """``c`` times ``by``, with ``padding`` written into its masked-out positions."""
    pad = (c.mask == 0)[:, None, :, None]
    return KVCache(c.layout, [(k * by).masked_fill(pad, padding) for k in c.keys],
                   [(v * by).masked_fill(pad, padding) for v in c.values], c.token_ids,
                   c.positions, c.mask)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 3), st.integers(1, 3), st.integers(2, 7),
       st.lists(st.integers(0, 6), min_size=3, max_size=3), st.floats(1e-3, 1e3),
       st.floats(-1e4, 1e4), st.floats(0.0, 1.0))
def test_cache_gap_is_the_share_of_the_gap_left(seed, batch, layers, length, pads, scale,
                                                 garbage, t):
    """1 when the state is the receiver's own cache, 0 when it is the teacher's, (1 - t)^2
    on the way between; padded positions never count; scaling all three caches changes
    nothing."""
    state, own, teacher = _caches(seed, batch, layers, length, pads[:batch])
    assert float(cache_gap(own, own, teacher)) == pytest.approx(1.0)
    assert float(cache_gap(teacher, own, teacher)) == pytest.approx(0.0, abs=1e-12)
    between = KVCache(own.layout, [o + t * (x - o) for o, x in zip(own.keys, teacher.keys)],
                      [o + t * (x - o) for o, x in zip(own.values, teacher.values)],
                      own.token_ids, own.positions, own.mask)
    # cache_gap sums in float32: near t = 1 the difference cancels to ~1e-4 relative
    assert float(cache_gap(between, own, teacher)) == pytest.approx((1 - t) ** 2, rel=1e-3,
                                                                    abs=1e-7)
    gap = float(cache_gap(state, own, teacher))
    assert float(cache_gap(*(_scaled(c, 1.0, garbage * i) for i, c in
                             enumerate((state, own, teacher), 1)))) == pytest.approx(gap, rel=1e-5)
    assert float(cache_gap(*(_scaled(c, scale) for c in (state, own, teacher)))) == \
        pytest.approx(gap, rel=1e-5)


def _held_out_gap(receiver, oracle, fuser, examples, cfg) -> float:
    prepared = prepare_examples(receiver, oracle, examples, cfg, teacher=oracle)
    with torch.no_grad():
        state = fused_batch_state(fuser, prepared, receiver.layout)
        return float(cache_gap(state, stack_caches([p.own for p in prepared]),
                               stack_caches([p.teacher for p in prepared])))


def test_cache_objective_closes_the_gap_on_prompts_it_never_saw(trio):
    """A fuser fitted to reproduce the oracle's cache (objective cache, teacher the oracle)
    on 24 entities' questions leaves little of the gap on 24 others; at lr 1e-9 it leaves
    all of it."""
    receiver, oracle, facts = trio
    names = list(facts)
    seen, held = ([Example(_question(n), " " + facts[n]) for n in part]
                  for part in (names[:24], names[24:]))
    gaps = {}
    for lr in (3e-3, 1e-9):
        cfg = FuserTrainConfig(objective="cache", hidden=32, epochs=30, batch_size=8, lr=lr,
                               dropout=0.0)
        (fuser,), _ = train_fusers(receiver, [oracle], seen, cfg, progress=False, teacher=oracle)
        gaps[lr] = _held_out_gap(receiver, oracle, fuser, held, cfg)
    # measured: 0.19 trained, 1.00 at lr 1e-9
    assert gaps[3e-3] <= 0.3 and gaps[1e-9] >= 0.95, gaps


@pytest.mark.parametrize("objective", ["cache", "answer+cache"])
def test_a_cache_objective_needs_a_teacher_of_the_receivers_tokenizer(trio, objective):
    receiver, oracle, facts = trio
    examples = [Example(_question(n), " " + v) for n, v in list(facts.items())[:2]]
    cfg = FuserTrainConfig(objective=objective, hidden=8, epochs=1)
    with pytest.raises(PlasticError, match="teacher"):
        train_fusers(receiver, [oracle], examples, cfg, progress=False)
    other = train_bpe_tokenizer([f"{ex.prompt} {ex.answer} of the {ex.answer}" for ex in
                                 examples] * 5, vocab_size=270)
    stranger = Peer("stranger", build_tiny("qwen3", seed=1, vocab_size=len(other), **SHAPE),
                    other)
    with pytest.raises(PlasticError, match="tokenizer"):
        train_fusers(receiver, [oracle], examples, cfg, progress=False, teacher=stranger)
    with pytest.raises(PlasticError, match="aligned"):
        FuserTrainConfig(objective=objective, mode="prefix")


def test_handover_refuses_another_architecture_or_tokenizer(trio):
    receiver, oracle, _ = trio
    tok = receiver.tokenizer
    llama = Peer("llama", build_tiny("llama", seed=1, vocab_size=len(tok), hidden_size=48,
                                     num_layers=3, num_heads=4, num_kv_heads=2,
                                     intermediate_size=96), tok)
    theta = Peer("theta", build_tiny("qwen3", seed=1, vocab_size=len(tok), rope_theta=500.0,
                                     **SHAPE), tok)
    other = train_bpe_tokenizer(["Q: Which organ does Zukalo act on? A: the liver."] * 5,
                                vocab_size=len(tok))
    retokenized = Peer("retokenized", oracle.model, other)
    for transmitter in (llama, theta, retokenized):
        with pytest.raises(PlasticError, match="one architecture and tokenizer"):
            handover_fuser(receiver, transmitter)


def test_ladder_quick_writes_every_rung_beside_its_control(tmp_path):
    """``plasticlm refine experiment ladder --quick`` (quick sandbox models from this session's
    PLASTICLM_HOME): a row per rung and control, rung a equal to alone."""
    from plasticlm.cli import main

    out = tmp_path / "ladder"
    assert main(["refine", "experiment", "ladder", "--quick", "--set", f"out={out}",
                 "--set", "progress=false"]) == 0
    report = json.loads((out / "report.json").read_text())
    rows = report["results"]
    assert {"alone", "transmitter alone, oracle", "transmitter alone, specialist"} <= set(rows)
    for knows, control in LABELS.values():
        assert knows in rows and control in rows, knows
        if control != "alone":
            assert rows[knows]["control"] == control and "minus_control" in rows[knows], knows
    assert report["zero_equals_alone"] is True
    assert rows[LABELS["zero"][0]]["accuracy"] == rows["alone"]["accuracy"]
    assert (out / "table.md").read_text().count("\n|") >= len(rows) + 1


def test_transfer_refuses_a_teacher_objective_on_rows_without_a_teacher():
    from plasticlm.config import load_config
    from plasticlm.experiments.refine.ladder import TransferConfig

    with pytest.raises(PlasticError, match="needs a teacher"):
        load_config(TransferConfig, None, ["fuser.objective=cache"])
    cfg = load_config(TransferConfig, None, ["fuser.objective=cache",
                                             'rows=["multi","co_c2c"]'])
    assert cfg.fuser.objective == "cache" and cfg.fuser.epochs == 2


def test_multi_and_co_c2c_train_toward_teachers_on_domain_text(tmp_path):
    """Item 5 of issue 39: the multi-party and Co-C2C rows with the cache recipe. Each fuser
    regresses toward its reader taught every fact (the receiver's oracle; the control's
    shape taught every fact for Co-C2C's other direction), on general + domain text that
    names no evaluation entity."""
    from plasticlm.cli import main
    from plasticlm.experiments.refine.training_text import domain_texts

    out = tmp_path / "transfer"
    assert main(["refine", "experiment", "transfer", "--quick", "--set", f"out={out}",
                 "--set", "progress=false", "--set", 'rows=["multi","co_c2c"]',
                 "--set", "fuser.objective=cache", "--set", "train_text=general+domain"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert {"oracle", "control-oracle", "half-0", "half-1"} <= set(report["taught"])
    assert "multi x2 (parallel), parties" in report["results"]
    assert "co-c2c, co-party B (control taught half 1)" in report["results"]
    assert report["n_general_examples"] == 32
    texts = domain_texts("quick:receiver", set())
    entity = re.findall(r"[A-Z][\w'-]*", texts[0])[-1]    # a name the first document uses
    named = [t for t in texts if re.search(rf"\b{entity}\b", t)]
    kept = domain_texts("quick:receiver", {entity})
    assert named and len(kept) == len(texts) - len(named)
    assert not any(re.search(rf"\b{entity}\b", t) for t in kept)
