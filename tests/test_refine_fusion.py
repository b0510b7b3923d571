"""A trained fuser lets a receiver answer facts only its transmitter knows (tiny models)."""

import random

import pytest
import torch

from plasticlm.eval import encode_with_bos
from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.refine import Example, FedRefine, Fuser, FuserTrainConfig, Link, Peer, train_fuser
from plasticlm.refine.train import evaluate_answer_loss

ORGANS = ["liver", "heart", "lung", "kidney", "brain", "skin"]
SYLLABLES = ["ka", "lo", "mi", "zu", "ren", "tor", "vex", "pa", "qui", "dol", "sar", "nim"]


# Tiny models on a shared CPU: one intra-op thread is much faster than two.
pytestmark = pytest.mark.usefixtures("one_thread")


def _question(name: str) -> str:
    return f"Q: Which organ does {name} act on? A:"


def _fit_answers(model, tokenizer, facts: dict[str, str], steps: int) -> None:
    """Teach ``model`` the answer tokens of ``facts`` (full batch, answer tokens only)."""
    seqs = [encode_with_bos(tokenizer, _question(n) + " " + v) for n, v in facts.items()]
    starts = [len(encode_with_bos(tokenizer, _question(n))) for n in facts]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        logits = model(input_ids=ids, attention_mask=mask).logits
        loss = sum(torch.nn.functional.cross_entropy(logits[i, c - 1: len(s) - 1], ids[i, c: len(s)])
                   for i, (c, s) in enumerate(zip(starts, seqs))) / len(seqs)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="module")
def pair():
    """A Llama specialist that knows 16 facts and a Qwen3 receiver that knows only the
    question format (its training answers are random), with different vocabularies."""
    torch.manual_seed(0)
    rng = random.Random(0)
    names = sorted({"".join(rng.choice(SYLLABLES) for _ in range(3)).capitalize()
                    for _ in range(40)})[:16]
    facts = {n: ORGANS[i % len(ORGANS)] for i, n in enumerate(names)}
    docs = [f"{_question(n)} {v}." for n, v in facts.items()] * 3
    t_tok = train_bpe_tokenizer(docs, vocab_size=300)
    r_tok = train_bpe_tokenizer(docs + ["the kidney of a brain"] * 3, vocab_size=280)
    spec = build_tiny("llama", seed=1, vocab_size=len(t_tok), hidden_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, intermediate_size=96)
    recv = build_tiny("qwen3", seed=2, vocab_size=len(r_tok), hidden_size=32, num_layers=3,
                      num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64)
    _fit_answers(spec, t_tok, facts, 50)
    others = {n[::-1].capitalize(): random.Random(n).choice(ORGANS) for n in names}
    _fit_answers(recv, r_tok, others, 30)
    return Peer("receiver", recv, r_tok), Peer("specialist", spec, t_tok), facts


def _choices(name: str, right: str) -> list[str]:
    r = random.Random(name)
    out = [right, *r.sample([o for o in ORGANS if o != right], 3)]
    r.shuffle(out)
    return out


def _accuracy(fr: FedRefine, facts: dict[str, str], mode: str) -> float:
    hits = 0
    for n, v in facts.items():
        ch = _choices(n, v)
        hits += fr.score(_question(n), ch, mode).choice == ch.index(v)
    return hits / len(facts)


def test_trained_fuser_beats_receiver_alone_on_specialist_facts(pair, tmp_path):
    receiver, specialist, facts = pair
    assert _accuracy(FedRefine(specialist), facts, "alone") >= 0.75   # it knows them
    examples = [Example(_question(n), " " + v) for n, v in facts.items()]
    fuser, losses = train_fuser(receiver, specialist, examples,
                                FuserTrainConfig(rank=16, epochs=14, lr=2e-2), progress=False)
    n = len(examples)
    assert sum(losses[-n:]) < 0.8 * sum(losses[:n])
    assert evaluate_answer_loss(receiver, specialist, fuser, examples) < \
        evaluate_answer_loss(receiver, specialist, None, examples)
    fr = FedRefine(receiver, [Link(specialist, fuser)])
    alone, c2c = _accuracy(fr, facts, "alone"), _accuracy(fr, facts, "c2c")
    assert c2c >= alone + 0.2, (alone, c2c)
    # The fuser is a small fraction of the receiver, and reloads to the same answers.
    r_params = sum(p.numel() for p in receiver.model.parameters())
    assert fuser.num_parameters() < 0.15 * r_params
    fuser.save_pretrained(tmp_path / "fuser")
    again = FedRefine(receiver, [Link(specialist, Fuser.from_pretrained(tmp_path / "fuser"))])
    q = next(iter(facts))
    assert again.score(_question(q), ORGANS[:4], "c2c").scores == \
        pytest.approx(fr.score(_question(q), ORGANS[:4], "c2c").scores, abs=1e-5)
