"""SCoL's policy experiment: preference pairs from exhaustive candidates, IPO on them, and
the held-out comparison of the learned choice (``plasticlm scol experiment policy``)."""

import copy
import json
from dataclasses import replace

import pytest
import torch

from plasticlm.data.records import QA, Answer, Passage
from plasticlm.eval import encode_with_bos
from plasticlm.experiments.scol import policy_experiment
from plasticlm.experiments.scol.choice_learning import ContextChoices, action_ids, train_ipo
from plasticlm.experiments.scol.oracle import layer_sets
from plasticlm.experiments.scol.policy_experiment import summarise
from plasticlm.experiments.scol.setup import ExperimentConfig
from plasticlm.scol.action_scores import candidate_logprobs, completion_logprob
from plasticlm.scol.policy import LayerGrammar, action_prompt, parse_layers

DRUGS = [("Tamasartan", "glaucoma"), ("Velizole", "asthma"), ("Quinomab", "gout"),
         ("Lorepril", "eczema"), ("Fendraxin", "migraine"), ("Olmavir", "psoriasis")]


def _drug(i, name, cond):
    text = f"Doctors prescribe {name} for {cond}. {name} treats {cond}."
    return Passage(name, text, (QA(f"pharmacology.unseen.{i}.treats",
                                   f"What condition is {name} used to treat?",
                                   (Answer(cond, text.index(cond)),)),))


@pytest.fixture(scope="module")
def world(tiny_squad_world, one_thread):
    passages = [_drug(i, *d) for i, d in enumerate(DRUGS)]
    folder, model, tok = tiny_squad_world(passages, "scol_policy")
    return folder, model, tok, passages


def test_action_ids_name_each_set_under_the_grammar(world):
    _, model, tok, _ = world
    grammar = LayerGrammar.for_model(model, tok, 3, 2)
    for s in layer_sets(3, 2):
        ids = action_ids(grammar, s)
        assert ids[-1] == grammar.end_id
        state = grammar.start()
        for t in ids[:-1]:
            state = grammar.advance(state, t)
            assert state is not None
        assert grammar.accepting(state)
        text = "layers: " + "".join(grammar.token_text[t] for t in ids[:-1])
        assert parse_layers(text, 3).layers == s


def test_candidate_logprobs_equal_each_completion_scored_alone(world):
    """The batched scores (rows of different lengths, padded) equal one-by-one scoring."""
    _, model, tok, passages = world
    grammar = LayerGrammar.for_model(model, tok, 3, 2)
    prompt = encode_with_bos(tok, action_prompt(passages[0].context, 3))
    completions = [action_ids(grammar, s) for s in [(0,), (1, 2), (2,), (0, 2)]]
    batched = candidate_logprobs(model, prompt, completions, grammar)
    alone = torch.stack([completion_logprob(model, prompt, c, grammar) for c in completions])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)
    assert len(set(batched.tolist())) == len(completions)


def _choices(model, tok, passages, grammar, best: int) -> list[ContextChoices]:
    """Every single layer of a 3-layer model as a candidate; layer ``best`` is rewarded most,
    the others less, under both LoRA seeds."""
    out = []
    for p in passages:
        prompt = action_prompt(p.context, 3)
        rewards = [1.0 if i == best else 0.1 * i for i in range(3)]
        out.append(ContextChoices(prompt, encode_with_bos(tok, prompt), [(0,), (1,), (2,)],
                                  [action_ids(grammar, (i,)) for i in range(3)],
                                  {"A": rewards, "B": rewards}, (0,)))
    return out


def _train(world, lr, best=1):
    _, model, tok, passages = world
    grammar = LayerGrammar.for_model(model, tok, 3, 1)
    train = _choices(model, tok, passages[:4], grammar, best)
    held = _choices(model, tok, passages[4:], grammar, best)
    policy = copy.deepcopy(model)
    cfg = ExperimentConfig(policy_steps=12, policy_batch_contexts=2, policy_eval_every=6)

    cfg = replace(cfg, scol=replace(cfg.scol, ipo_lr=lr, ipo_tau=0.02))
    torch.manual_seed(0)
    return train_ipo(policy, model, tok, train, held, grammar, cfg, 0, progress=False), held


def test_ipo_teaches_the_rewarded_layer_on_prompts_it_never_saw(world):
    """Trained on pairs that always prefer layer 1, the policy ranks held-out pairs right and
    names layer 1 on held-out prompts; at lr 1e-9 nothing moves."""
    curve, held = _train(world, 3e-3)
    start, end = curve[0], curve[-1]
    assert [p["step"] for p in curve] == [0, 6, 12]
    assert end["held_out_pair_accuracy"] == 1.0 > start["held_out_pair_accuracy"]
    assert end["held_out_choices"] == [[1]] * len(held)
    assert start["held_out_choices"] != end["held_out_choices"]
    idle, _ = _train(world, 1e-9)
    assert idle[-1]["held_out_pair_accuracy"] == idle[0]["held_out_pair_accuracy"]
    assert idle[-1]["held_out_choices"] == idle[0]["held_out_choices"]


def test_pairs_point_from_the_better_candidate_and_skip_ties(world):
    c = ContextChoices("", [], [(0,), (1,), (2,)], [[], [], []],
                       {"A": [0.5, 0.2, 0.5]}, (0,))
    assert sorted(c.pairs("A")) == [(0, 1), (2, 1)]


def _record(a, b, pick, policy=(0,)):
    return {"candidates": [[0], [1], [2]], "n_sets": 3, "policy": list(policy),
            "pick": list(pick),
            "rewards": {k: [{"loglik": {"total": v, "acquisition": v, "forgetting": 0.0}}
                            for v in vals] for k, vals in (("A", a), ("B", b))}}


def test_the_learned_choice_is_scored_on_seed_b_beside_each_control():
    """learned = the last curve point's choices, untrained = the first point's, fixed = the
    best layer on the training walks (seed A), all read from seed B's held-out rewards."""
    train = [[_record([0.0, 1.0, 0.0], [0.0, 0.0, 0.0], (1,))] * 2] * 3
    held = [[_record([0.0, 0.0, 0.0], [0.1, 0.3, 0.9], (2,))] * 2] * 3
    curves = [[{"step": 0, "held_out_choices": [[0], [0]], "held_out_pair_accuracy": 0.2,
                "train_pair_accuracy": 0.3},
               {"step": 5, "held_out_choices": [[2], [2]], "held_out_pair_accuracy": 0.8,
                "train_pair_accuracy": 0.9}]] * 3
    s = summarise(train, held, curves)
    assert s["fixed_on_train"] == [1]
    m = {k: v["pooled"]["mean"] for k, v in s["margins"].items()}
    assert m["total: learned - untrained"] == pytest.approx(0.8)
    assert m["total: learned - last"] == pytest.approx(0.0)
    assert m["total: learned - fixed"] == pytest.approx(0.6)
    assert m["total: learned - random"] == pytest.approx(0.9 - 1.3 / 3)
    assert s["learned_picks"] == {"2": 6} and s["untrained_picks"] == {"0": 6}
    assert s["curve"][-1]["held_out_pair_accuracy"]["mean"] == pytest.approx(0.8)


def test_policy_cli_reports_the_curve_and_reuses_its_walks(world, tmp_path, capsys,
                                                           monkeypatch):
    from plasticlm.cli import main

    folder, *_ = world
    out = tmp_path / "policy"
    args = ["scol", "experiment", "policy", "--out", str(out), "--no-progress",
            "--set", f"model={folder / 'model'}", "--set", f"squad={folder / 'squad.json'}",
            "--set", "eval_length=2", "--set", "policy_train_contexts=3", "--set", "seeds=2",
            "--set", "policy_steps=2", "--set", "policy_eval_every=1",
            "--set", "scol.lora.steps=2", "--set", "scol.lora.replay=0",
            "--set", "scol.forget_window=1"]
    assert main(args) == 0
    assert "held-out pair accuracy" in capsys.readouterr().out
    report = json.loads((out / "policy.json").read_text())
    assert (out / "policy_curve.png").stat().st_size > 1000
    assert [len(c) for c in report["curves"]] == [3, 3]
    assert report["summary"]["pairs_per_seed"] == [
        sum(len(policy_experiment._pairs_of(r)) for r in rs) for rs in report["train_records"]]
    for rs in report["held_out_records"]:
        assert all(set(r["rewards"]) == {"A", "B"} for r in rs)

    real_run_stream = policy_experiment.run_stream

    def walk_again(*a, **k):
        raise AssertionError("the walks were made again")
    monkeypatch.setattr(policy_experiment, "run_stream", walk_again)
    assert main(args[:-2] + ["--set", "policy_steps=3", "--set", "scol.forget_window=1"]) == 0
    with pytest.raises(AssertionError, match="made again"):
        main(args + ["--set", "scol.lora.steps=3"])

    walked = []                 # one more seed walks only itself, reusing seeds 0 and 1
    monkeypatch.setattr(policy_experiment, "run_stream",
                        lambda *a, **k: walked.append(a[4]) or real_run_stream(*a, **k))
    assert main(args + ["--set", "seeds=3"]) == 0
    assert walked == [2, 10_002]
