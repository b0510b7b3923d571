"""FedRefine mechanics on tiny random models: caches, alignment, fusers, modes, leakage."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plasticlm.errors import PlasticError
from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.refine import (
    FedRefine,
    Fuser,
    Link,
    Peer,
    RefineConfig,
    align_tokens,
    extract_cache,
    kv_layout,
    layer_map,
    learned_inversion,
    measure_leakage,
    rule_rephrase,
)
from plasticlm.refine.cache import continue_from_cache
from plasticlm.refine.fusers.align import derotate, rotate

TEXTS = ["Q: Which organ does Kalomira act on? A: liver.",
         "Q: Which company makes Zutorex? A: Orvane Labs.",
         "Doctors prescribe Kalomira for asthma. The main target of Zutorex is the heart.",
         "Name the firm that produces one thing. For which illness do doctors give it?"] * 4
PROMPT = "Q: Which organ does Kalomira act on? A:"
CHOICES = ["liver", "heart", "lung", "skin"]


# Tiny models on a shared CPU: one intra-op thread is much faster than two.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizers():
    return train_bpe_tokenizer(TEXTS, vocab_size=300), train_bpe_tokenizer(TEXTS[:8], vocab_size=280)


@pytest.fixture(scope="module")
def peers(tokenizers):
    """A Qwen3 receiver and two transmitters of other depth, heads, head dim and vocabulary."""
    rt, tt = tokenizers
    r = build_tiny("qwen3", seed=0, vocab_size=len(rt), hidden_size=32, num_layers=3,
                   num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64)
    t1 = build_tiny("llama", seed=1, vocab_size=len(tt), hidden_size=48, num_layers=5,
                    num_heads=4, num_kv_heads=4, head_dim=12, intermediate_size=64)
    t2 = build_tiny("qwen2", seed=2, vocab_size=len(rt), hidden_size=32, num_layers=2,
                    num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64)
    return Peer("r", r, rt), Peer("t1", t1, tt), Peer("t2", t2, rt)


def _perturbed(fuser: Fuser, seed: int = 0) -> Fuser:
    """An untrained fuser is the identity; give it random output maps (and C2C gates that are
    on) to test the plumbing."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in fuser.named_parameters():
            if name.endswith(("up.weight", "out.weight")) and "blocks" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith("gate_logits"):
                p.fill_(2.0)
    return fuser.eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_cache_round_trip_same_logits(arch):
    m = build_tiny(arch, seed=3, vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                   num_kv_heads=2)
    ids = torch.randint(4, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = m(input_ids=ids).logits
        cache, head = extract_cache(m, ids[:, :7], model_name=arch)
        tail = continue_from_cache(m, cache, ids[:, 7:])
    assert cache.layout.model_type == arch
    assert (cache.num_layers, cache.num_kv_heads, cache.head_dim, cache.length) == (2, 2, 8, 7)
    assert cache.dtype == torch.float32 and cache.token_ids.tolist() == ids[:, :7].tolist()
    torch.testing.assert_close(head, full[:, :7], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tail, full[:, 7:], atol=1e-5, rtol=1e-5)


@given(st.integers(1, 40), st.integers(1, 40), st.sampled_from(["last", "depth"]))
def test_layer_map_is_monotone_in_range_and_ends_aligned(r, s, strategy):
    m = layer_map(r, s, strategy)
    assert len(m) == r and all(0 <= x < s for x in m)
    assert m == sorted(m) and m[-1] == s - 1
    if strategy == "depth" and r > 1:
        assert m[0] == 0


def test_layer_map_last_aligned_formula():
    assert layer_map(4, 6, "last") == [2, 3, 4, 5]
    assert layer_map(4, 3, "last") == [0, 0, 1, 2]
    with pytest.raises(PlasticError):
        layer_map(4, 3, "middle")


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([8, 12, 16]), st.floats(1e3, 1e6))
def test_derotate_inverts_rotate(seed, head_dim, theta):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(2, 3, 5, head_dim, generator=g, dtype=torch.float64)
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    pos = torch.randint(0, 500, (2, 5), generator=g)
    torch.testing.assert_close(derotate(rotate(k, inv, pos), inv, pos), k)


def test_rotate_matches_the_model_cache_keys():
    """Keys in the cache are the model's un-rotated keys rotated at their positions."""
    m = build_tiny("llama", seed=4, vocab_size=64, hidden_size=32, num_layers=1, num_heads=4)
    ids = torch.randint(4, 64, (1, 9), generator=torch.Generator().manual_seed(1))
    cache, _ = extract_cache(m, ids)
    layout = kv_layout(m)
    raw = derotate(cache.keys[0], layout.inv_freq, cache.positions)
    # De-rotated keys of the same token at two positions are equal (layer 0 sees tokens only).
    ids2 = torch.cat([ids[:, :1], ids[:, 5:6], ids[:, 5:6]], 1)
    c2, _ = extract_cache(m, ids2)
    raw2 = derotate(c2.keys[0], layout.inv_freq, c2.positions)
    torch.testing.assert_close(raw2[:, :, 1], raw2[:, :, 2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(raw2[:, :, 1], raw[:, :, 5], atol=1e-5, rtol=1e-5)


def test_token_alignment_receiver_is_reference(tokenizers):
    rt, tt = tokenizers
    al = align_tokens(rt, tt, PROMPT)
    assert al.receiver_ids[0] == rt.bos_token_id and al.transmitter_ids[0] == tt.bos_token_id
    assert len(al.index) == len(al.receiver_ids)
    assert al.index == sorted(al.index) and al.index[0] == 0
    assert al.index[-1] == len(al.transmitter_ids) - 1
    same = align_tokens(rt, rt, PROMPT)
    assert same.index == list(range(len(same.receiver_ids)))


def test_fuser_shapes_across_architectures(peers):
    r, t1, t2 = peers
    for t in (t1, t2):
        f = Fuser.for_pair(r.layout, t.layout, rank=4)
        rc, _ = extract_cache(r.model, torch.randint(4, 200, (2, 6)))
        tc, _ = extract_cache(t.model, torch.randint(4, 200, (2, 9)))
        fused = f.fuse_aligned(rc, tc, torch.randint(0, 9, (2, 6)))
        assert [k.shape for k in fused.keys] == [k.shape for k in rc.keys]
        # Zero-initialised output: an untrained fuser leaves the cache unchanged.
        for a, b in zip(fused.values, rc.values):
            torch.testing.assert_close(a, b)
        pre = f.prefix(tc, r.layout, start=1)
        assert pre.keys[0].shape == (2, r.layout.num_kv_heads, 8, r.layout.head_dim)
        assert pre.positions[0].tolist() == list(range(1, 9))
        assert len(f.layers) == r.layout.num_layers


def test_fuser_size_and_save_load(peers, tmp_path):
    r, t1, _ = peers
    f = _perturbed(Fuser.for_pair(r.layout, t1.layout, kind="lowrank", rank=4, mode="prefix"))
    in_w = 2 * 4 * 12
    out_w = 2 * 2 * 8
    per_layer = in_w + in_w * 4 + 4 * out_w + out_w + (4 + out_w) * 2 + 2 + 1
    assert f.num_parameters() == 3 * per_layer
    # C2C: per path, norms t_w + r_w, Linear in, 2 blocks, out norm, Linear out, head weight
    c2c = Fuser.for_pair(r.layout, t1.layout, kind="c2c", hidden=8)
    t_w, r_w, hid, heads = 4 * 12, 2 * 8, 8, 2
    path = (t_w + r_w) + (t_w + r_w + 1) * hid + 2 * (hid + 2 * (hid * hid + hid)) + hid \
        + (hid + 1) * r_w + (hid + 1) * heads
    assert c2c.num_parameters() == 3 * (2 * path + 2)
    f.save_pretrained(tmp_path / "f")
    g = Fuser.from_pretrained(tmp_path / "f")
    assert g.config == f.config
    for (n, a), (_, b) in zip(f.state_dict().items(), g.state_dict().items()):
        torch.testing.assert_close(a, b, msg=n)
    with pytest.raises(PlasticError, match="not a fuser folder"):
        Fuser.from_pretrained(tmp_path)
    with pytest.raises(PlasticError, match="transmitter cache"):
        FedRefine(r, [Link(peers[2], f)])


def test_prefix_mode_with_rephrased_prompt_of_other_length(peers):
    r, t1, _ = peers
    f = _perturbed(Fuser.for_pair(r.layout, t1.layout, rank=4, mode="prefix"))
    fr = FedRefine(r, [Link(t1, f)], RefineConfig(private=True))
    prep = fr.prepare(PROMPT, "c2c")
    rephrased = prep.rephrased[0]
    assert rephrased != PROMPT and "Kalomira" in rephrased
    t_len = len(t1.tokenizer(rephrased)["input_ids"])
    r_len = len(r.tokenizer(PROMPT)["input_ids"])
    assert t_len != r_len
    assert prep.cache.length == 1 + t_len          # receiver BOS + the projected prefix
    assert prep.start is None and len(prep.tail) == r_len
    s = fr.score(PROMPT, CHOICES, "c2c")
    alone = fr.score(PROMPT, CHOICES, "alone")
    assert len(s.scores) == 4 and all(x < 0 for x in s.scores)
    assert s.scores != alone.scores and s.wire_bytes > alone.wire_bytes == 0
    # The same scores come from running the receiver on prefix + prompt by hand.
    ids = torch.tensor([prep.tail])
    logits = continue_from_cache(r.model, prep.cache, ids)
    assert torch.isfinite(logits).all()
    with pytest.raises(PlasticError, match="prefix fusers"):
        g = Fuser.for_pair(r.layout, t1.layout, rank=4)
        FedRefine(r, [Link(t1, g)], RefineConfig(private=True)).prepare(PROMPT, "c2c")


def test_draft_only_prefix_shares_only_the_drafted_tokens(peers):
    from plasticlm.refine.peer import transmitter_ids

    r, t1, _ = peers
    f = _perturbed(Fuser.for_pair(r.layout, t1.layout, rank=4, mode="prefix", draft_tokens=3,
                                  share="draft"))
    full = _perturbed(Fuser.for_pair(r.layout, t1.layout, rank=4, mode="prefix",
                                     draft_tokens=3))
    prompt_len = len(t1.tokenizer(PROMPT)["input_ids"]) + 1     # + BOS
    drafted = len(transmitter_ids(t1, PROMPT, 3)) - prompt_len
    assert 0 < drafted <= 3
    prep = FedRefine(r, [Link(t1, f)]).prepare(PROMPT, "c2c")
    assert prep.cache.length == 1 + drafted                   # receiver BOS + the draft
    tc, _ = extract_cache(t1.model, torch.tensor([transmitter_ids(t1, PROMPT, 3)]))
    pre = f.prefix(tc, r.layout, start=1, prompt_length=prompt_len)
    assert pre.token_ids[0].tolist() == tc.token_ids[0, prompt_len:].tolist()
    with pytest.raises(PlasticError, match="prompt_length"):
        f.prefix(tc, r.layout, start=1)
    s_draft = FedRefine(r, [Link(t1, f)]).score(PROMPT, CHOICES, "c2c")
    s_full = FedRefine(r, [Link(t1, full)]).score(PROMPT, CHOICES, "c2c")
    assert 0 < s_draft.wire_bytes < s_full.wire_bytes
    for bad in ({"mode": "aligned", "draft_tokens": 3}, {"mode": "prefix", "draft_tokens": 0}):
        with pytest.raises(PlasticError, match="share='draft'"):
            Fuser.for_pair(r.layout, t1.layout, rank=4, share="draft", **bad)
    with pytest.raises(PlasticError, match="config share: input should be 'all' or 'draft'"):
        Fuser.for_pair(r.layout, t1.layout, rank=4, mode="prefix", share="some")


def test_all_modes_run_and_cost(peers):
    r, t1, t2 = peers
    f1 = _perturbed(Fuser.for_pair(r.layout, t1.layout, rank=4), 1)
    f2 = _perturbed(Fuser.for_pair(r.layout, t2.layout, rank=4), 2)
    back = _perturbed(Fuser.for_pair(t1.layout, r.layout, rank=4), 3)
    fr = FedRefine(r, [Link(t1, f1), Link(t2, f2)], RefineConfig(t2t_max_new_tokens=3),
                   reverse_fuser=back)
    seq = FedRefine(r, [Link(t1, f1), Link(t2, f2)], RefineConfig(order="sequence"))
    out = {m: fr.score(PROMPT, CHOICES, m) for m in ("alone", "t2t", "c2c", "multi", "co-c2c")}
    assert out["alone"].wire_bytes == 0
    assert 0 < out["t2t"].wire_bytes < out["c2c"].wire_bytes < out["multi"].wire_bytes
    assert out["co-c2c"].partner_choice is not None
    assert out["c2c"].scores != out["alone"].scores != out["multi"].scores
    assert seq.score(PROMPT, CHOICES, "multi").scores != out["multi"].scores
    for s in out.values():
        assert 0 < s.ttft <= s.latency
    a = fr.ask(PROMPT, "c2c", max_new_tokens=3)
    assert isinstance(a.text, str) and a.wire_bytes == out["c2c"].wire_bytes
    # c2c bytes: the prompt to the transmitter + its read layers' K and V in bf16.
    n_t = len(align_tokens(r.tokenizer, t1.tokenizer, PROMPT).transmitter_ids)
    layers = len(set(f1.config.layers))
    assert out["c2c"].wire_bytes == len(PROMPT.encode()) + 2 * layers * n_t * 4 * 12 * 2
    with pytest.raises(PlasticError, match="unknown FedRefine mode 'telepathy'; choose one of "
                       "alone, t2t, c2c, multi, co-c2c"):
        fr.prepare(PROMPT, "telepathy")


def test_rule_rephrase_is_deterministic_and_keeps_names():
    q = "Q: Which organ does Kalomira act on? A:"
    assert rule_rephrase(q) == rule_rephrase(q) == "Q: On what body part does Kalomira work? A:"
    other = rule_rephrase("Q: What is the colour of Zorp? A:")
    assert other != "Q: What is the colour of Zorp? A:" and "Zorp" in other


def test_leakage_raw_is_recovered_rephrased_less(peers):
    _, t1, _ = peers
    prompts = [PROMPT, "Q: Which company makes Zutorex? A:"]
    res = measure_leakage(t1.model, t1.tokenizer, prompts, [rule_rephrase(p) for p in prompts])
    assert res.raw_recall == 1.0 and res.raw_exact == 1.0
    assert res.rephrased_recall < 0.8


def test_learned_inversion_reads_prompts_in_clear_and_less_after_rephrasing(peers):
    """A decoder trained on public texts (other sentences with the same words) names the
    tokens of unseen prompts from layer 0 of their caches; an untrained decoder does not, and
    a rephrased prompt's cache gives fewer of the original tokens."""
    _, t1, _ = peers
    public = ["Q: Which organ does Zutorex act on? A: heart.",
              "Q: Which company makes Kalomira? A: Orvane Labs.",
              "Doctors prescribe Kalomira for asthma. The main target of Zutorex is the heart.",
              "Name the firm that produces one thing. For which illness do doctors give it?"] * 3
    prompts = [PROMPT, "Q: Which company makes Zutorex? A:"]
    rephrased = [rule_rephrase(p) for p in prompts]
    trained, = learned_inversion(t1.model, t1.tokenizer, public, prompts, rephrased, layers=[0],
                                 steps=300, batch_size=256)
    untrained, = learned_inversion(t1.model, t1.tokenizer, public, prompts, rephrased,
                                   layers=[0], steps=0)
    assert trained.raw_recall >= 0.9 and trained.raw_position_accuracy >= 0.9
    assert untrained.raw_recall < 0.5
    assert trained.rephrased_recall <= trained.raw_recall - 0.2


class _PassThrough(torch.nn.Module):
    """A layer map that hands the transmitter's K/V over unchanged: aligned, it replaces the
    receiver's own (returns the difference); prefix, it is the prefix itself."""

    def forward(self, tk, tv, rk=None, rv=None):
        return (tk, tv) if rk is None else (tk - rk, tv - rv)


@pytest.mark.parametrize("mode", ["aligned", "prefix"])
def test_identity_pass_through_equals_reading_the_text(peers, mode):
    """With the receiver as its own transmitter and a pass-through map, the fusion plumbing
    (alignment, RoPE de-/re-rotation, positions, BOS) must give what reading the text gives:
    aligned, the receiver alone; prefix, the receiver reading the shared prompt and then the
    prompt again. A shifted alignment or a wrong position fails this."""
    r, _, _ = peers
    fuser = Fuser.for_pair(r.layout, r.layout, mode=mode, layer_map="last")
    fuser.layers = torch.nn.ModuleList(_PassThrough() for _ in fuser.layers)
    fr = FedRefine(r, [Link(Peer("r-too", r.model, r.tokenizer), fuser)])
    prep = fr.prepare(PROMPT, "c2c")
    ids = prep.prompt_ids
    read = ids if mode == "aligned" else ids + ids[1:]
    with torch.no_grad():
        starts = None if prep.start is None else torch.tensor([prep.start])
        fused = continue_from_cache(r.model, prep.cache, torch.tensor([prep.tail]),
                                    start_positions=starts)[0]
        text = r.model(input_ids=torch.tensor([read])).logits[0, -len(prep.tail):]
    assert torch.allclose(fused, text, atol=1e-4), (fused - text).abs().max()
