"""SCoL policy: the action parser (fuzzed), the grammar automaton and constrained decoding."""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.scol.action_scores import completion_logprob, constrained_entropy
from plasticlm.scol.policy import (
    LayerGrammar,
    action_prompt,
    format_action,
    parse_layers,
    sample_actions,
)

TEXTS = ["layers: 0, 1, 2, 3", "Tamasartan acts mainly on the pancreas.",
         "Doctors prescribe Tamasartan for glaucoma.", "update some of the 4 layers (0 to 3)",
         "layers: 12, 3", "Q: Which company makes Tamasartan? A: Orvane Labs."] * 4


@pytest.fixture(scope="module")
def tiny(one_thread):
    tok = train_bpe_tokenizer(TEXTS, vocab_size=300)
    model = build_tiny("qwen3", seed=0, vocab_size=len(tok), hidden_size=32, num_layers=4,
                       num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64,
                       max_position_embeddings=512).eval()
    return model, tok


def test_parser_examples():
    assert parse_layers("layers: 3, 7", 8).layers == (3, 7)
    p = parse_layers("layers: 7, 3, 3, 99, -1", 8)
    assert (p.layers, p.duplicates, p.out_of_range, p.garbage, p.valid) == ((3, 7), 1, 2,
                                                                          False, False)
    g = parse_layers("no idea at all", 8)
    assert g.layers == () and g.garbage and not g.valid
    # Numbers before "layers:" (e.g. in a preamble) are not actions.
    assert parse_layers("Of 28 layers, LAYERS: 27", 28).layers == (27,)


@settings(max_examples=300, deadline=None)
@given(st.text(), st.integers(1, 40))
def test_parser_never_raises_and_counts_every_integer(text, n):
    p = parse_layers(text, n)
    assert list(p.layers) == sorted(set(p.layers))
    assert all(0 <= i < n for i in p.layers)
    at = text.lower().find("layers:")
    body = text[at + 7:] if at >= 0 else text
    found = re.findall(r"-?\d+", body)
    assert len(p.layers) + p.out_of_range + p.duplicates == len(found)
    assert p.garbage == (not found)


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 30), min_size=1, max_size=6), st.integers(31, 64))
def test_format_then_parse_roundtrip(layers, n):
    text = format_action(layers)
    assert parse_layers(text, n).layers == tuple(sorted(layers))
    assert parse_layers(text, n).valid


def test_grammar_masks(tiny):
    model, tok = tiny
    g = LayerGrammar.for_model(model, tok, 12, max_layers=2)
    start = g.start()
    digits = [t for t, s in g.token_text.items() if s[0].isdigit()]
    assert g.allowed(start)[digits].any()               # the prompt ends with "layers: "
    assert not g.allowed(start)[g.end_id]              # nothing yet: cannot end
    s = g.step_text(start, "1")
    assert g.accepting(s) and g.allowed(s)[g.end_id]   # "1" is complete ...
    assert g.step_text(s, "1") is not None             # ... and "11" too (< 12)
    assert g.step_text(s, "2") is None                 # "12" is out of range
    assert g.step_text(start, "01") is None            # no leading zeros
    assert g.step_text(start, "layers: 1") is None     # the prefix is the prompt's
    s2 = g.step_text(start, "3, ")
    assert g.step_text(s2, "3") is None                # no duplicates
    assert g.step_text(g.step_text(start, "3, 4"), ",") is None  # max_layers = 2


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_walk_through_the_grammar_is_a_valid_action(tiny, data):
    model, tok = tiny
    n = data.draw(st.integers(1, 12))
    g = LayerGrammar.for_model(model, tok, n, max_layers=data.draw(st.integers(1, 3)))
    state, text = g.start(), ""
    for _ in range(40):
        allowed = g.allowed(state).nonzero().flatten().tolist()
        tid = data.draw(st.sampled_from(allowed))
        if tid == g.end_id:
            break
        text += g.token_text[tid]
        state = g.advance(state, tid)
    else:
        pytest.fail("the walk did not end within 40 tokens")
    p = parse_layers("layers: " + text, n)
    assert p.valid and 1 <= len(p.layers) <= g.max_layers
    nums = [int(x) for x in re.findall(r"\d+", text)]
    assert len(nums) == len(set(nums)) == len(p.layers)


def test_constrained_sampling_of_an_untrained_model_gives_valid_actions(tiny):
    model, tok = tiny
    g = LayerGrammar.for_model(model, tok, 4, max_layers=3)
    prompt = action_prompt("Tamasartan acts mainly on the pancreas.", 4)
    acts = sample_actions(model, tok, prompt, g, k=12, temperature=2.0,
                          generator=torch.Generator().manual_seed(0))
    assert len(acts) == 12
    for a in acts:
        assert a.parsed.valid and 1 <= len(a.layers) <= 3
        assert a.text.startswith("layers: ")
        assert a.token_ids[-1] == g.end_id
    assert len({a.layers for a in acts}) > 1          # temperature 2 explores
    greedy = sample_actions(model, tok, prompt, g, k=2, temperature=0.0)
    assert greedy[0].token_ids == greedy[1].token_ids


def test_completion_logprob_and_entropy(tiny):
    model, tok = tiny
    g = LayerGrammar.for_model(model, tok, 4, max_layers=2)
    prompt = action_prompt("Doctors prescribe Tamasartan for glaucoma.", 4)
    a = sample_actions(model, tok, prompt, g, k=1, temperature=0.0)[0]
    from plasticlm.eval import encode_with_bos

    ids = encode_with_bos(tok, prompt)
    assert ids[-len(tok("layers: ", add_special_tokens=False)["input_ids"]):] == \
        tok("layers: ", add_special_tokens=False)["input_ids"]  # the prompt ends with it
    lp = completion_logprob(model, ids, a.token_ids)
    # Reference: sum of per-token log-probs from a full forward.
    full = torch.tensor([ids + a.token_ids])
    with torch.no_grad():
        raw = model(input_ids=full).logits[0]
    logits = raw.log_softmax(-1)
    ref = sum(float(logits[len(ids) - 1 + j, t]) for j, t in enumerate(a.token_ids))
    assert float(lp.detach()) == pytest.approx(ref, abs=1e-4)
    # With the grammar: renormalised over the allowed tokens, forced tokens left out. By
    # hand: "3" then the end token with at most 1 layer -> the end is forced.
    g1 = LayerGrammar.for_model(model, tok, 4, max_layers=1)
    three = [t for t, s in g1.token_text.items() if s == "3"][0]
    comp = [three, g1.end_id]
    masked = completion_logprob(model, ids, comp, g1)
    with torch.no_grad():
        step0 = model(input_ids=torch.tensor([ids])).logits[0, -1]
    allowed = g1.allowed(g1.start())
    assert int(allowed.sum()) > 1 and g1.allowed(g1.advance(g1.start(), three)).sum() == 1
    by_hand = float(step0[three] - torch.logsumexp(step0[allowed], 0))
    assert float(masked.detach()) == pytest.approx(by_hand, abs=1e-4)
    # one layer of one: every token is forced and the completion carries no choice
    g0 = LayerGrammar.for_model(model, tok, 1)
    zero = [t for t, s in g0.token_text.items() if s == "0"][0]
    assert float(completion_logprob(model, ids, [zero, g0.end_id], g0).detach()) == 0.0
    ent = constrained_entropy(model, ids, a.token_ids, g)
    assert ent.requires_grad and 0 <= float(ent.detach()) <= torch.log(torch.tensor(300.0))
