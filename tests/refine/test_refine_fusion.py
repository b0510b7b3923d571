"""Fusers on tiny models: a zero fuser is the receiver alone, training fits, C2C gates are
hard at inference, and transfer is measured on entities the fuser never saw, against a
control transmitter of the same shape that does not know the facts."""

import json
import random

import pytest
import torch

from plasticlm.eval import encode_with_bos
from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.refine import (
    Example,
    FedRefine,
    Fuser,
    FuserTrainConfig,
    Link,
    Peer,
    train_fuser,
    train_fusers,
)
from plasticlm.refine.examples import general_examples
from plasticlm.refine.fusers.train import evaluate_answer_loss
from plasticlm.sandbox import teach_facts

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
    """A Llama specialist that knows 32 facts, a control Llama of the same shape and
    tokenizer that learned other answers for the same names, and a Qwen3 receiver that knows
    only the question format, with a different vocabulary."""
    torch.manual_seed(0)
    rng = random.Random(0)
    names = sorted({"".join(rng.choice(SYLLABLES) for _ in range(3)).capitalize()
                    for _ in range(80)})[:32]
    facts = {n: ORGANS[i % len(ORGANS)] for i, n in enumerate(names)}
    # the control's answers are drawn per name, not a function of the right one: a relabelling
    # of the facts would carry the same information and a probe would read it as well
    wrong = {n: random.Random(n + "/control").choice([o for o in ORGANS if o != v])
             for n, v in facts.items()}
    docs = [f"{_question(n)} {v}." for n, v in facts.items()] * 3
    t_tok = train_bpe_tokenizer(docs, vocab_size=300)
    r_tok = train_bpe_tokenizer(docs + ["the kidney of a brain"] * 3, vocab_size=280)
    shape = dict(vocab_size=len(t_tok), hidden_size=48, num_layers=3, num_heads=4,
                 num_kv_heads=2, intermediate_size=96)
    spec = build_tiny("llama", seed=1, **shape)
    control = build_tiny("llama", seed=1, **shape)
    recv = build_tiny("qwen3", seed=2, vocab_size=len(r_tok), hidden_size=32, num_layers=3,
                      num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64)
    _fit_answers(spec, t_tok, facts, 200)
    _fit_answers(control, t_tok, wrong, 200)
    # the specialist is fitted to every fact; the control to a different organ for each name
    others = {n[::-1].capitalize(): random.Random(n).choice(ORGANS) for n in names}
    _fit_answers(recv, r_tok, others, 30)
    return (Peer("receiver", recv, r_tok), Peer("specialist", spec, t_tok),
            Peer("control", control, t_tok), facts)


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


@pytest.mark.parametrize("kind", ["c2c", "lowrank"])
def test_zero_fuser_is_the_receiver_alone(pair, kind):
    """An untrained fuser (zero output map) leaves every choice score as the receiver's own
    to 1e-5, also with C2C's gates forced on; a non-zero output map changes them."""
    receiver, specialist, _, facts = pair
    fuser = Fuser.for_pair(receiver.layout, specialist.layout, kind=kind, hidden=32).eval()
    fr = FedRefine(receiver, [Link(specialist, fuser)])
    name = next(iter(facts))
    alone = fr.score(_question(name), ORGANS[:4], "alone").scores
    if kind == "c2c":
        with torch.no_grad():
            for layer in fuser.layers:
                layer.gate_logits.fill_(5.0)
    assert fr.score(_question(name), ORGANS[:4], "c2c").scores == pytest.approx(alone, abs=1e-5)
    with torch.no_grad():
        for name_, p in fuser.named_parameters():
            if name_.endswith(("out.weight", "up.weight")):
                p.normal_(std=0.5)
    assert fr.score(_question(name), ORGANS[:4], "c2c").scores != pytest.approx(alone, abs=1e-3)


@pytest.mark.parametrize("kind", ["c2c", "lowrank"])
def test_fused_scores_depend_on_what_the_transmitter_holds(pair, kind):
    """One fuser with a non-zero output map, fed the specialist's cache or the control's (same
    shape and tokenizer, other answers): the receiver's choice scores differ. A fuser that
    ignores the transmitter (reads only the receiver's own cache) fails this."""
    receiver, specialist, control, facts = pair
    torch.manual_seed(3)
    fuser = Fuser.for_pair(receiver.layout, specialist.layout, kind=kind, hidden=32).eval()
    with torch.no_grad():
        for name_, p in fuser.named_parameters():
            if name_.endswith(("out.weight", "up.weight")):
                p.normal_(std=0.5)
        for layer in getattr(fuser, "layers", []):
            if hasattr(layer, "gate_logits"):
                layer.gate_logits.fill_(5.0)
    name = next(iter(facts))
    scores = [FedRefine(receiver, [Link(t, fuser)]).score(_question(name), ORGANS[:4],
                                                           "c2c").scores
              for t in (specialist, control)]
    assert scores[0] != pytest.approx(scores[1], abs=1e-3)


def test_c2c_gates_are_gumbel_in_training_and_hard_at_inference(pair):
    receiver, specialist, _, _ = pair
    fuser = Fuser.for_pair(receiver.layout, specialist.layout, kind="c2c", hidden=16)
    layer = fuser.layers[0]
    with torch.no_grad():
        layer.gate_logits.copy_(torch.tensor([0.3, -0.3]))
    fuser.train()
    fuser.set_temperature(1.0)
    soft = torch.stack([layer.gates() for _ in range(200)])
    assert 0.05 < soft.std(0).min() and bool(((soft > 0) & (soft < 1)).all())
    fuser.set_temperature(1e-3)  # annealed: samples are (almost) 0 or 1
    cold = torch.stack([layer.gates() for _ in range(200)])
    assert ((cold < 0.01) | (cold > 0.99)).float().mean() > 0.97
    fuser.eval()
    assert layer.gates().tolist() == [1.0, 0.0]
    assert 0 in fuser.gates_on()["keys"] and 0 not in fuser.gates_on()["values"]


def test_general_examples_cut_documents_and_qa_lines():
    texts = ["Q: Who founded Ravvale? A: Fenna Holrow.\nQ: Which river? A: Orrin.",
             "Alma lives in Brill. Alma paints boats. Alma likes tea."]
    ex = general_examples(texts, n=10, seed=0)
    qa = {(e.prompt, e.answer) for e in ex if e.prompt.startswith("Q:")}
    assert qa == {("Q: Who founded Ravvale? A:", " Fenna Holrow"), ("Q: Which river? A:", " Orrin")}
    story = [e for e in ex if not e.prompt.startswith("Q:")]
    assert len(story) == 1 and story[0].prompt.startswith("Alma lives in Brill.")
    assert (story[0].prompt + story[0].answer + ".") in texts[1]


def _split(facts):
    names = sorted(facts)
    return ({n: facts[n] for n in names[:20]}, {n: facts[n] for n in names[20:]})


def _train(receiver, transmitter, facts, **kw):
    examples = [Example(_question(n), " " + v) for n, v in facts.items()]
    cfg = FuserTrainConfig(hidden=32, epochs=40, batch_size=4, lr=3e-3, dropout=0.0, **kw)
    return train_fuser(receiver, transmitter, examples, cfg, progress=False)


def test_fuser_training_fits_its_training_facts(pair, tmp_path):
    """Fitting, not transfer: the answer loss on the training facts falls well below the
    receiver's own (would fail at lr = 1e-9), and a saved fuser reloads to the same answers."""
    receiver, specialist, _, facts = pair
    seen, _ = _split(facts)
    examples = [Example(_question(n), " " + v) for n, v in seen.items()]
    fuser, losses = _train(receiver, specialist, seen)
    assert sum(losses[-10:]) < 0.85 * sum(losses[:10])
    # measured: 1.11 nats with the fuser, 1.53 alone
    assert evaluate_answer_loss(receiver, specialist, fuser, examples) < \
        0.85 * evaluate_answer_loss(receiver, specialist, None, examples)
    fr = FedRefine(receiver, [Link(specialist, fuser)])
    fuser.save_pretrained(tmp_path / "fuser")
    again = FedRefine(receiver, [Link(specialist, Fuser.from_pretrained(tmp_path / "fuser"))])
    q = next(iter(seen))
    assert again.score(_question(q), ORGANS[:4], "c2c").scores == \
        pytest.approx(fr.score(_question(q), ORGANS[:4], "c2c").scores, abs=1e-5)


@pytest.mark.xfail(strict=True, reason="not shown at this scale: fusing the specialist or the "
                   "control reaches the same training loss (1.11 vs 1.10 nats) and neither "
                   "beats chance on unseen entities")
def test_fuser_transfers_to_unseen_entities_beyond_a_control_transmitter(pair):
    """Trained on 20 entities, scored on 12 others that the specialist knows and the fuser
    never saw: fusing the specialist must beat fusing the control transmitter (same shape,
    wrong answers) by 25 points."""
    receiver, specialist, control, facts = pair
    seen, unseen = _split(facts)
    spec_fuser, _ = _train(receiver, specialist, seen)
    ctrl_fuser, _ = _train(receiver, control, seen)
    with_spec = _accuracy(FedRefine(receiver, [Link(specialist, spec_fuser)]), unseen, "c2c")
    with_ctrl = _accuracy(FedRefine(receiver, [Link(control, ctrl_fuser)]), unseen, "c2c")
    assert with_spec >= with_ctrl + 0.25, (with_spec, with_ctrl)


def test_probe_reads_the_specialists_answer_from_its_cache(pair):
    """A linear probe reads the organ of entities it was not trained on from the specialist's
    last-layer cache at the last prompt token, and not from the control's: 4-fold
    cross-validation over the 32 entities, so every entity is scored once by a probe trained
    on the other 24 (measured 66% vs 25%, n = 32)."""
    from plasticlm.experiments.refine.probe import ProbeItem, probe_table

    _, specialist, control, facts = pair
    names = sorted(facts)

    def items(ns):
        return [ProbeItem(_question(n), tuple(_choices(n, facts[n])),
                          _choices(n, facts[n]).index(facts[n])) for n in ns]

    last = (2, "last")
    spec, ctrl = [], []
    for fold in range(4):
        test = names[fold::4]
        train = [n for n in names if n not in test]
        spec += probe_table(specialist, items(train), items(test))[last]
        ctrl += probe_table(control, items(train), items(test))[last]
    assert sum(spec) / len(spec) >= sum(ctrl) / len(ctrl) + 0.3, (sum(spec), sum(ctrl))


def test_transfer_experiment_quick_writes_every_row_with_its_control(tmp_path, capsys):
    from plasticlm.cli import main
    from plasticlm.experiments.refine.transfer import entity_of

    assert entity_of("Which organ does Quinemab act on?") == "Quinemab"
    out = tmp_path / "transfer"
    assert main(["refine", "experiment", "transfer", "--quick", "--set", f"out={out}",
                 "--set", "progress=false"]) == 0
    report = json.loads((out / "report.json").read_text())
    rows = report["results"]
    for row in ("c2c, general fuser", "c2c, task fuser", "c2c, task fuser, fuse_last", "t2t",
                "transmitter alone"):
        assert f"{row}, specialist" in rows and f"{row}, control" in rows
        assert "minus_control" in rows[f"{row}, specialist"]
    ladder = {"c2c draft-only, general fuser, specialist": "c2c draft-only, general fuser, control",
              "c2c, general fuser, oracle": "self-fusion, general fuser, receiver",
              "prefix c2c private (rephrased), general fuser, oracle":
                  "prefix c2c, general fuser, oracle",
              "multi x2 (parallel), parties": "multi x2 (parallel), untaught",
              "c2c via party 1 (qwen3) only, parties": "c2c via party 1 (qwen3) only, untaught",
              "co-c2c, co-party A (receiver taught half 0)":
                  "alone, co-party A (receiver taught half 0)"}
    for row, control in ladder.items():
        assert rows[row]["control"] == control and "minus_control" in rows[row], row
    assert "minus_control_on_taught" in rows["c2c via party 0 (llama) only, parties"]
    assert len(report["inversion"]["layers"]) == 2   # every layer of the quick oracle
    assert report["oracle_probe"]["rows"]          # the oracle is probed beside the receiver
    assert report["probe_gate"]["rows"] and "Probe gate" in capsys.readouterr().out
    # a rerun with one more seed trains only the new seed's fusers
    trained = len((out / "metrics.jsonl").read_text().splitlines())
    assert main(["refine", "experiment", "transfer", "--quick", "--set", f"out={out}", "--set",
                 "seeds=2", "--set", "rows=[\"general\"]", "--set", "progress=false"]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == trained + 2
    again = json.loads((out / "report.json").read_text())["results"]
    assert again["c2c, general fuser, specialist"]["seeds"] == 2
    assert again["c2c, task fuser, specialist"]["seeds"] == 1


def test_batched_answer_loss_equals_the_mean_of_single_losses(pair):
    """Fused caches of different lengths, stacked with left padding, give each example the
    loss it has alone (aligned and prefix fusion)."""
    from plasticlm.eval import pad_id_of
    from plasticlm.refine.fusers.prepared import (
        answer_loss,
        batch_answer_loss,
        fused_batch_state,
        fused_state,
        prepare_example,
    )

    receiver, specialist, _, facts = pair
    names = sorted(facts)[:3]
    examples = [Example(_question(n) + " Tell me" * i, " " + facts[n]) for i, n in enumerate(names)]
    for mode in ("aligned", "prefix"):
        fuser = Fuser.for_pair(receiver.layout, specialist.layout, hidden=16, mode=mode).eval()
        with torch.no_grad():
            for name, p in fuser.named_parameters():
                if name.endswith("out.weight"):
                    p.normal_(std=0.3)
                elif name.endswith("gate_logits"):
                    p.fill_(2.0)
        batch = [prepare_example(receiver, specialist, ex, mode) for ex in examples]
        assert len({p.own.length if p.own is not None else 0 for p in batch} |
                   {p.transmitter.length for p in batch}) > 1
        with torch.no_grad():
            states = [fused_state(fuser, p, receiver.layout) for p in batch]
            single = [float(answer_loss(receiver.model, s, p.tail, p.answer, p.start))
                      for s, p in zip(states, batch)]
            joint = float(batch_answer_loss(receiver.model, pad_id_of(receiver.tokenizer),
                                            fused_batch_state(fuser, batch, receiver.layout),
                                            batch))
        assert joint == pytest.approx(sum(single) / len(single), abs=1e-5)


def test_teach_facts_teaches_a_model_its_facts(pair):
    """Fact drills (how the transfer experiment makes its oracle and parties) take a model at
    chance to answering its facts; at lr = 1e-9 this fails."""
    _, specialist, _, facts = pair
    tok = specialist.tokenizer
    peer = Peer("taught", build_tiny("llama", seed=3, vocab_size=len(tok), hidden_size=48,
                                     num_layers=3, num_heads=4, num_kv_heads=2,
                                     intermediate_size=96), tok)
    before = _accuracy(FedRefine(peer), facts, "alone")
    teach_facts(peer.model, tok, [(_question(n), " " + v) for n, v in facts.items()],
                steps=150, lr=1e-2, progress=False)
    after = _accuracy(FedRefine(peer), facts, "alone")
    assert after >= 0.9 and after >= before + 0.4, (before, after)   # measured 25% -> 100%


def test_fusers_trained_together_each_help_and_their_sum_helps(pair):
    """Two transmitters' fusers trained on random subsets (C2C's bitmask): on the training
    facts, each alone and both summed in parallel (multi) answer better than the receiver
    alone."""
    receiver, specialist, control, facts = pair
    seen, _ = _split(facts)
    examples = [Example(_question(n), " " + v) for n, v in seen.items()]
    cfg = FuserTrainConfig(hidden=32, epochs=40, batch_size=4, lr=3e-3, dropout=0.0)
    (f_s, f_c), _ = train_fusers(receiver, [specialist, control], examples, cfg, progress=False)
    fr = FedRefine(receiver, [Link(specialist, f_s), Link(control, f_c)])
    alone = _accuracy(fr, seen, "alone")
    each = [_accuracy(FedRefine(receiver, [link]), seen, "c2c") for link in fr.links]
    both = _accuracy(fr, seen, "multi")
    # measured: alone 20%, each 45% / 40%, both 45% (n = 20)
    assert min(each) >= alone + 0.15 and both >= alone + 0.15, (alone, each, both)


def test_co_c2c_does_not_degrade_a_partner(pair):
    """Co-C2C between the receiver and the specialist (which knows the facts): the
    specialist's answers, read from its cache refined by the receiver's through a trained
    reverse fuser, stay as good as alone; the receiver's side equals one-way C2C."""
    receiver, specialist, _, facts = pair
    seen, _ = _split(facts)
    forward, _ = _train(receiver, specialist, seen)
    reverse, _ = _train(specialist, receiver, seen)
    fr = FedRefine(receiver, [Link(specialist, forward)], reverse_fuser=reverse)
    partner = 0
    for n, v in seen.items():
        ch = _choices(n, v)
        s = fr.score(_question(n), ch, "co-c2c")
        partner += s.partner_choice == ch.index(v)
        assert s.scores == pytest.approx(fr.score(_question(n), ch, "c2c").scores, abs=1e-5)
    alone = _accuracy(FedRefine(specialist), seen, "alone")
    assert partner / len(seen) >= alone - 0.05, (partner / len(seen), alone)


def test_choice_kl_moves_the_receiver_toward_the_transmitters_answers(pair):
    """The federation's objective (no gold label, no oracle): a fuser trained to match the
    specialist's own distribution over each item's choices brings the receiver's fused
    distribution toward it on the training items (KL falls to under half of the receiver
    alone's) and its choices toward the specialist's answers. Fails with a uniform target, or
    with the KL reading the receiver's distribution as the target."""
    from plasticlm.refine.fusers.objectives import choice_kl
    from plasticlm.refine.fusers.prepared import transmitter_choice_probs

    receiver, specialist, _, facts = pair
    seen, _ = _split(facts)
    examples = [Example(_question(n), " " + v, choices=tuple(_choices(n, v)))
                for n, v in seen.items()]
    cfg = FuserTrainConfig(hidden=32, epochs=30, batch_size=4, lr=3e-3, dropout=0.0,
                           objective="choice-kl")
    fuser, losses = train_fuser(receiver, specialist, examples, cfg, progress=False)

    def mean_kl(fr: FedRefine) -> float:
        out = []
        for ex in examples:
            scores = torch.tensor(fr.score(ex.prompt, list(ex.choices), "c2c").scores)
            out.append(float(choice_kl(transmitter_choice_probs(specialist, ex.prompt,
                                                                ex.choices), scores)))
        return sum(out) / len(out)

    zero = Fuser.for_pair(receiver.layout, specialist.layout, hidden=32).eval()
    before = mean_kl(FedRefine(receiver, [Link(specialist, zero)]))
    trained = FedRefine(receiver, [Link(specialist, fuser)])
    after = mean_kl(trained)
    assert after < 0.5 * before, (before, after)
    assert _accuracy(trained, seen, "c2c") > _accuracy(trained, seen, "alone") + 0.2


def test_choice_kl_needs_choices():
    from plasticlm.errors import PlasticError
    from plasticlm.refine.fusers.objectives import choice_kl

    p = torch.tensor([0.7, 0.2, 0.1])
    assert float(choice_kl(p, torch.log(p))) == pytest.approx(0.0, abs=1e-6)
    assert float(choice_kl(p, torch.zeros(3))) > 0
    tok = train_bpe_tokenizer(["Q: Which organ does Ofloxin act on? A: liver."] * 20,
                              vocab_size=300)
    peer = Peer("p", build_tiny("qwen3", vocab_size=len(tok)), tok)
    with pytest.raises(PlasticError, match="choice-kl objective needs multiple-choice"):
        train_fuser(peer, peer, [Example("Q: Which organ does Ofloxin act on? A:", " liver")],
                    FuserTrainConfig(objective="choice-kl", epochs=1), progress=False)


def test_entity_positions_are_the_tokens_of_the_entitys_name(pair):
    """In either vocabulary, the positions entity-cache regresses at decode to the entity's
    name and nothing of the words around it."""
    from plasticlm.refine.fusers.align import entity_positions

    receiver, specialist, _, facts = pair
    name = sorted(facts)[0]
    prompt = _question(name)
    for peer in (receiver, specialist):
        ids = encode_with_bos(peer.tokenizer, prompt)
        pos = entity_positions(peer.tokenizer, prompt, name)
        assert pos == list(range(pos[0], pos[-1] + 1))
        assert peer.tokenizer.decode([ids[i] for i in pos]).strip() == name


def test_entity_cache_closes_the_gap_at_the_entitys_tokens(pair):
    """Regressing at the entity's tokens toward a teacher (the receiver taught the facts):
    the share of the cache gap left there falls well below the receiver alone's 1.0."""
    import copy

    from plasticlm.refine.fusers.objectives import cache_gap, focus_mask
    from plasticlm.refine.fusers.prepared import fused_state, prepare_example

    receiver, specialist, _, facts = pair
    seen, _ = _split(facts)
    teacher_model = copy.deepcopy(receiver.model)
    _fit_answers(teacher_model, receiver.tokenizer, seen, 60)
    teacher = Peer("teacher", teacher_model, receiver.tokenizer)
    examples = [Example(_question(n), " " + v, entity=n) for n, v in seen.items()]
    cfg = FuserTrainConfig(hidden=32, epochs=30, batch_size=4, lr=3e-3, dropout=0.0,
                           objective="entity-cache")
    fuser, losses = train_fuser(receiver, specialist, examples, cfg, progress=False,
                                teacher=teacher)
    left = []
    with torch.no_grad():
        for ex in examples:
            p = prepare_example(receiver, specialist, ex, "aligned", teacher=teacher)
            left.append(float(cache_gap(fused_state(fuser, p, receiver.layout), p.own,
                                        p.teacher, focus_mask([p]))))
    assert sum(left) / len(left) < 0.4, left   # measured 0.14; regressing elsewhere: ~0.7
