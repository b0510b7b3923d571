"""plasticlm.eval against real models: stories260K (real weights) and a random tiny Qwen3."""

import csv
from types import SimpleNamespace

import pytest
import torch

from plasticlm.errors import PlasticError
from plasticlm.eval import (
    MCConfig,
    chunked_token_losses,
    cut_at_stop,
    encode_pair,
    encode_with_bos,
    evaluate_mc,
    evaluate_mc_items,
    extract_choice,
    generate_texts,
    mmlu_prompt,
    perplexity,
    score_continuations,
    streaming_ce,
)
from plasticlm.models import build_tiny, from_llama2c, train_bpe_tokenizer


@pytest.fixture(scope="module")
def stories(shared_data):
    folder = shared_data / "models" / "stories260K"
    if not (folder / "stories260K.bin").exists():
        pytest.skip(f"{folder}/stories260K.bin is absent")
    return from_llama2c(folder / "stories260K.bin", folder / "tok512.bin")


@pytest.fixture(scope="module")
def tiny_stories_texts(shared_data):
    path = shared_data / "tinystories" / "tinystories_sample.txt"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    parts = path.read_text(encoding="utf-8")[:60_000].split("<|endoftext|>")
    return [p.strip() for p in parts if p.strip()][:12]


@pytest.fixture(scope="module")
def bpe_tokenizer():
    corpus = ["the cat sat on the mat", "a dog ran in the park", "Lily likes the red ball"] * 5
    return train_bpe_tokenizer(corpus, vocab_size=300, min_frequency=1)


def _reference_logprob(model, ctx, cont):
    """log p(cont | ctx) from one unpadded forward pass, no batching."""
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = model(ids).logits[0, :-1].float().log_softmax(-1)
    tgt = ids[0, 1:]
    return logp[torch.arange(len(tgt)), tgt][len(ctx) - 1 :].sum().item()


# ---- encoding ----------------------------------------------------------------------------


def test_one_bos_for_llama2c_and_pretrain_tokenizers(stories, bpe_tokenizer):
    _, tok = stories
    ids = encode_with_bos(tok, "Lily went to the park.")
    assert ids == tok("Lily went to the park.")["input_ids"]  # llama2c adds BOS itself
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    ids = encode_with_bos(bpe_tokenizer, "the cat sat")
    assert ids[0] == bpe_tokenizer.bos_token_id and ids.count(bpe_tokenizer.bos_token_id) == 1
    assert ids[1:] == bpe_tokenizer("the cat sat")["input_ids"]  # which adds none itself
    assert encode_with_bos(bpe_tokenizer, "<s><s>the cat sat") == ids


def test_no_bos_when_tokenizer_has_none(bpe_tokenizer):
    from transformers import PreTrainedTokenizerFast

    bare = PreTrainedTokenizerFast(tokenizer_object=bpe_tokenizer.backend_tokenizer)
    assert bare.bos_token_id is None
    assert encode_with_bos(bare, "the cat") == bare("the cat", add_special_tokens=False)["input_ids"]
    with pytest.raises(PlasticError):
        encode_pair(bare, "", "the cat")


def test_encode_pair_keeps_joint_tokenisation(stories):
    _, tok = stories
    ctx, cont = encode_pair(tok, "Answer:", " A")
    assert ctx + cont == encode_with_bos(tok, "Answer: A")
    assert tok.decode(cont) == "A" or tok.decode(cont).strip() == "A"
    with pytest.raises(PlasticError):
        encode_pair(tok, "Answer:", "")


# ---- log-prob scoring: batched == unbatched == reference ---------------------------------


def _pairs(seed, vocab):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(7):
        n_ctx, n_cont = torch.randint(1, 25, (2,), generator=g).tolist()
        seq = torch.randint(3, vocab, (n_ctx + n_cont,), generator=g).tolist()
        out.append((seq[:n_ctx], seq[n_ctx:]))
    # one-token continuations of shared contexts, as answer letters are scored
    out += [(out[0][0], [t]) for t in (5, 9, 11)] + [(out[3][0], [t]) for t in (5, 7)]
    out.append((out[4][0], [8]))  # a lone one-token continuation takes the general path
    return out


@pytest.mark.parametrize("which", ["stories", "qwen3"])
def test_batched_scoring_equals_unbatched_and_reference(which, request):
    if which == "stories":
        model = request.getfixturevalue("stories")[0]
    else:
        model = build_tiny("qwen3", seed=1, vocab_size=256, hidden_size=64, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=16)
    pairs = _pairs(0, 256)
    ctxs, conts = [p[0] for p in pairs], [p[1] for p in pairs]
    one = score_continuations(model, ctxs, conts, batch_size=1)
    ref = [_reference_logprob(model, c, x) for c, x in pairs]
    assert [s.logprob for s in one] == pytest.approx(ref, abs=1e-4)
    for side in ("right", "left"):
        many = score_continuations(model, ctxs, conts, batch_size=4, padding_side=side)
        assert [s.logprob for s in many] == pytest.approx(ref, abs=1e-4)
        assert [s.num_tokens for s in many] == [len(x) for x in conts]
        assert [s.greedy for s in many] == [s.greedy for s in one]


def test_greedy_flag_marks_the_models_own_continuation(stories):
    model, tok = stories
    text = generate_texts(model, tok, ["Once upon a time"], max_new_tokens=8)[0]
    ctx, cont = encode_pair(tok, "Once upon a time", text)
    own, other = score_continuations(model, [ctx, ctx], [cont, cont[::-1]])
    assert own.greedy and own.logprob > other.logprob


# ---- perplexity --------------------------------------------------------------------------


def test_perplexity_of_stories260k_on_tinystories(stories, tiny_stories_texts):
    model, tok = stories
    res = perplexity(model, tok, tiny_stories_texts, max_length=512, batch_size=6)
    assert 1.1 < res.nll < 1.5  # the data README measures ~1.27 nats/token
    one = perplexity(model, tok, tiny_stories_texts[:3], batch_size=1)
    three = perplexity(model, tok, tiny_stories_texts[:3], batch_size=3)
    assert one.num_tokens == three.num_tokens
    assert one.nll == pytest.approx(three.nll, abs=1e-5)
    # windows of 64 tokens give less context, hence a higher loss, over the same tokens
    short = perplexity(model, tok, tiny_stories_texts[:3], max_length=64)
    assert short.num_tokens == one.num_tokens and short.nll > one.nll


# ---- generation --------------------------------------------------------------------------


def test_greedy_generation_from_bos_and_batching(stories):
    model, tok = stories
    prompts = ["", "Tom had a big red"]
    batched = generate_texts(model, tok, prompts, max_new_tokens=16, batch_size=2)
    assert batched[0].startswith("Once upon a time, there was a little girl named Lily")
    assert generate_texts(model, tok, prompts[1:], max_new_tokens=16) == batched[1:]
    assert cut_at_stop(batched[0], (",",)) == "Once upon a time"


# ---- multiple choice ---------------------------------------------------------------------


def test_continuation_scoring_knows_story_words(stories):
    model, tok = stories
    questions = ["Once upon a time, there was a little", "Lily and her mom went to the",
                 "The dog wagged its"]
    choices = [["theorem", "girl", "tax", "algebra"], ["park", "quantum", "senate", "tax"],
               ["invoice", "equation", "parliament", "tail"]]
    cfg = MCConfig(method="continuation", continuation_template="{question}")
    res = evaluate_mc(model, tok, questions, choices, [1, "A", 3], cfg)
    assert res.accuracy == 1.0 and res.predictions == [1, 0, 3]
    mean = evaluate_mc(model, tok, questions, choices, [1, 0, 3],
                       MCConfig(method="continuation", normalise="mean",
                                continuation_template="{question}"))
    assert mean.accuracy == 1.0
    items = [SimpleNamespace(question=q, choices=c, answer=a)
             for q, c, a in zip(questions, choices, [1, 0, 3])]
    assert evaluate_mc_items(model, tok, items, cfg).predictions == res.predictions


def _mmlu_rows(shared_data, n_per_subject=15):
    folder = shared_data / "mmlu" / "test"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    rows = []
    for subject in ("high_school_geography", "marketing", "nutrition", "sociology",
                    "miscellaneous", "high_school_psychology", "world_religions", "virology"):
        with (folder / f"{subject}_test.csv").open(newline="", encoding="utf-8") as f:
            rows += [r for r in csv.reader(f) if len(r) == 6][:n_per_subject]
    return rows


def test_mmlu_random_model_is_near_chance(shared_data, stories):
    _, tok = stories
    rows = _mmlu_rows(shared_data)
    model = build_tiny("qwen3", seed=0, vocab_size=tok.vocab_size, hidden_size=64,
                       num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
    q, c, a = [r[0] for r in rows], [r[1:5] for r in rows], [r[5] for r in rows]
    res = evaluate_mc(model, tok, q, c, a, MCConfig(method="letters", batch_size=16))
    assert res.n == 120
    assert 0.15 <= res.accuracy <= 0.35  # chance is 0.25
    assert all(len(s) == 4 for s in res.scores)


def test_mmlu_generation_method_extracts_letters(shared_data, stories):
    model, tok = stories
    rows = _mmlu_rows(shared_data, n_per_subject=1)[:4]
    q, c, a = [r[0] for r in rows], [r[1:5] for r in rows], [r[5] for r in rows]
    res = evaluate_mc(model, tok, q, c, a, MCConfig(method="generate", max_new_tokens=6))
    texts = generate_texts(model, tok, [mmlu_prompt(x, y) for x, y in zip(q, c)], 6,
                           stop=("\n",))
    assert res.predictions == [extract_choice(t) for t in texts]
    assert res.accuracy == sum(p is not None and "ABCD"[p] == g
                               for p, g in zip(res.predictions, a)) / 4


# ---- streaming CE ------------------------------------------------------------------------


def test_chunked_losses_equal_one_pass_and_stream_curve(stories, tiny_stories_texts):
    model, tok = stories
    ids = torch.tensor(encode_with_bos(tok, " ".join(tiny_stories_texts))[:700])
    full = chunked_token_losses(model)(ids)
    chunked = chunked_token_losses(model, chunk_size=96)(ids)
    assert full.shape == (699,)
    assert torch.allclose(full, chunked, atol=1e-4)
    res = streaming_ce(chunked_token_losses(model, 128), [ids, ids[:500]], bucket_size=100)
    assert res.normalised[0] == 1.0 and len(res.mean_ce) == 6
    assert res.num_streams == [2, 2, 2, 2, 1, 1]
    assert res.mean_ce[0] == pytest.approx(float(full[:100].mean()), rel=1e-4)
