"""SCoL adaptation, commit, rewards, IPO, meta-training (resume), Fisher and the CLI smoke."""

import argparse
import copy
import dataclasses
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plasticlm.config import from_dict, override
from plasticlm.errors import PlasticError
from plasticlm.experiments.scol.fisher import layer_fisher, random_recall, recall, top_layers
from plasticlm.experiments.scol.setup import SCOL_METHODS
from plasticlm.scol.consolidate import (
    LoraTrainConfig,
    adapt_lora,
    changed_parameters,
    context_windows,
    float32_master,
    layer_change,
)
from plasticlm.scol.contexts import contexts_from_passages, split_streams
from plasticlm.scol.ipo import PreferencePair, ipo_loss, ipo_update, preference_pairs
from plasticlm.scol.meta import SCoLConfig, consolidate_stream, meta_train
from plasticlm.scol.rewards import intrinsic_reward, supervised_reward


@pytest.fixture(scope="module")
def tiny(tiny_squad_world, one_thread, drug_passages):
    passages = drug_passages
    folder, model, tok = tiny_squad_world(passages, "scol_tiny", ["layers: 0, 1, 2, 3"] * 3,
                                          num_layers=4, max_position_embeddings=512)
    return model, tok, passages, folder


def test_commit_changes_exactly_the_chosen_layers(tiny):
    model, tok, passages, _ = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    w = context_windows(tok, passages[0].context, 64)
    cfg = LoraTrainConfig(steps=3, lr=1e-2)
    merged, losses = adapt_lora(model, (1, 3), w, cfg)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    changed = changed_parameters(model, merged)
    targets = [n for n, _ in model.named_parameters()
               if n.split(".")[-2] in cfg.target_modules and ".layers." in n]
    expect = [n for n in targets if n.split(".")[2] in ("1", "3")]
    assert sorted(changed) == sorted(expect)
    delta = layer_change(model, merged)
    assert delta[0] == 0.0 and delta[2] == 0.0 and delta[1] > 0 and delta[3] > 0
    assert next(merged.parameters()).dtype == torch.float32
    assert set(merged.state_dict()) == set(model.state_dict())  # no LoRA leftovers
    assert losses[-1] < losses[0]


def test_candidates_trained_together_are_independent_and_local(tiny):
    from plasticlm.scol.candidates import adapt_lora_together

    model, tok, passages, _ = tiny
    w = context_windows(tok, passages[1].context, 64)
    cfg = LoraTrainConfig(steps=3, lr=1e-2)
    sets = [(0,), (1, 3), (2,)]
    merged, curves = adapt_lora_together(model, sets, w, cfg, seeds=[5, 6, 7])
    assert len(curves) == 3 and all(len(c) == 3 for c in curves)
    for s, m in zip(sets, merged):
        touched = {int(n.split(".")[2]) for n in changed_parameters(model, m)}
        assert touched == set(s)
    alone, _ = adapt_lora_together(model, [sets[1]], w, cfg, seeds=[6])
    for a, b in zip(merged[1].parameters(), alone[0].parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert curves[-1][1] < curves[0][1]


def test_float32_master_and_bad_layers(tiny):
    model, tok, passages, _ = tiny

    half = copy.deepcopy(model).to(torch.bfloat16)
    assert next(float32_master(half).parameters()).dtype == torch.float32
    w = context_windows(tok, passages[0].context, 64)
    with pytest.raises(PlasticError):
        adapt_lora(model, (7,), w, LoraTrainConfig(steps=1))


def test_rewards_on_toy_cases():
    r = supervised_reward(0.8, 0.6, 0.4, lam=0.5)
    assert (r.acquisition, r.forgetting, r.total) == pytest.approx((0.8, 0.2, 0.7))
    assert supervised_reward(0.5, None, None, lam=3.0).total == 0.5   # first context
    r = intrinsic_reward(3.0, 2.0, [2.0, 4.0], [2.5, 4.0], lam=2.0)
    # gain 1.0; drops 0.25 and 0.0 -> mean 0.125
    assert (r.acquisition, r.forgetting, r.total) == pytest.approx((1.0, 0.125, 0.75))
    assert intrinsic_reward(1.0, 1.5, [], [], lam=1.0).total == pytest.approx(-0.5)


def test_ipo_loss_matches_hand_computation():
    lw, ll = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.5])
    rw, rl = torch.tensor([-1.5, -2.0]), torch.tensor([-2.5, -2.0])
    # h = (lw - ll) - (rw - rl) = [2 - 1, -0.5 - 0] = [1, -0.5]; tau 0.25 -> target 2
    expected = ((1 - 2) ** 2 + (-0.5 - 2) ** 2) / 2
    assert float(ipo_loss(lw, ll, rw, rl, tau=0.25)) == pytest.approx(expected)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=4, max_size=4), st.floats(0.01, 2.0))
def test_ipo_loss_property(vals, tau):
    t = [torch.tensor([v]) for v in vals]
    h = (vals[0] - vals[1]) - (vals[2] - vals[3])
    assert float(ipo_loss(*t, tau=tau)) == pytest.approx((h - 1 / (2 * tau)) ** 2, rel=1e-4,
                                                         abs=1e-4)
    # Zero exactly when the policy's margin over the reference is 1/(2 tau).
    assert float(ipo_loss(torch.tensor([1 / (2 * tau)]), torch.tensor([0.0]), torch.tensor([0.0]),
                          torch.tensor([0.0]), tau=tau)) == pytest.approx(0.0, abs=1e-8)


def test_preference_pairs():
    pairs = preference_pairs([1, 2], [[5], [6], [5]], [0.5, 0.1, 0.9])
    got = {(p.chosen_ids, p.rejected_ids) for p in pairs}
    assert got == {((5,), (6,))}  # (5 vs 5) never pairs; both 5s beat 6, deduplicated by set
    assert all(p.margin > 0 for p in pairs)


def test_ipo_update_moves_preference_the_right_way(tiny):
    model, tok, _, _ = tiny

    from plasticlm.eval import encode_with_bos

    policy = copy.deepcopy(model)
    ref = copy.deepcopy(model)
    prompt = encode_with_bos(tok, "Which layers? ")
    chosen = tuple(tok("layers: 3", add_special_tokens=False)["input_ids"])
    rejected = tuple(tok("layers: 0, 1", add_special_tokens=False)["input_ids"])
    pair = PreferencePair(tuple(prompt), chosen, rejected, 1.0)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    stats = ipo_update(policy, ref, [pair], opt, tau=0.5, epochs=3)
    assert stats["h_before"] == pytest.approx(0.0, abs=1e-6)   # policy == reference
    assert stats["h_after"] > 0.1
    assert stats["ipo_loss_after"] < stats["ipo_loss_before"]


def test_stream_consolidation_and_meta_training_resume(tiny, tmp_path):
    model, tok, passages, _ = tiny
    ctxs = contexts_from_passages(passages)
    train, evaluation = split_streams(ctxs, 1, 2, 2, seed=0)
    assert not {c.id for c in train[0]} & {c.id for c in evaluation}
    cfg = SCoLConfig(k=3, lora=LoraTrainConfig(steps=2), outer_steps=1, ipo_epochs=1,
                     reward="intrinsic", temperature=2.0)
    seen = []
    final, records, pairs = consolidate_stream(model, tok, train[0], cfg, "best",
                                               on_commit=lambda t, m: seen.append(t))
    assert seen == [0, 1] and len(records) == 2
    for r in records:  # the committed candidate is the best one
        assert r.reward.total == max(c["reward"]["total"] for c in r.candidates)
    assert all(p.margin > 0 for p in pairs)
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    meta_train(model, tok, train, cfg, tmp_path / "m", progress=False)
    assert (tmp_path / "m" / "checkpoint" / "model.safetensors").exists()
    cfg = dataclasses.replace(cfg, outer_steps=2)
    meta_train(model, tok, train, cfg, tmp_path / "m", resume=True, progress=False)
    steps = [json.loads(x)["outer_step"] for x in
             (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]
    state = json.loads((tmp_path / "m" / "checkpoint" / "state.json").read_text())
    assert state["outer_step"] == 2
    # IPO's reference is the policy before meta-training, fixed across outer steps (and
    # resumes); the preference buffer accumulates the steps' pairs
    from plasticlm.models import load_causal_lm

    reference, _ = load_causal_lm(tmp_path / "m" / "reference")
    policy, _ = load_causal_lm(tmp_path / "m" / "checkpoint")
    for name, p in reference.named_parameters():
        torch.testing.assert_close(p.float(), before[name])
    assert any(not torch.equal(p.float(), before[n]) for n, p in policy.named_parameters())
    rows = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["buffered_pairs"] == min(cfg.pair_buffer,
                                            rows[0]["buffered_pairs"] + rows[1]["new_pairs"])
    saved = json.loads((tmp_path / "m" / "checkpoint" / "pairs.json").read_text())
    assert len(saved) == rows[1]["buffered_pairs"]
    with pytest.raises(PlasticError):
        meta_train(model, tok, train, cfg, tmp_path / "empty", resume=True, progress=False)


def test_fisher_and_recall(tiny):
    model, tok, passages, _ = tiny
    f = layer_fisher(model, tok, passages[0].context)
    assert len(f) == 4 and all(x > 0 and math.isfinite(x) for x in f)
    raw = layer_fisher(model, tok, passages[0].context, normalise=False)
    size = sum(p.numel() for n, p in model.named_parameters() if ".layers.0." in f".{n}")
    assert f[0] == pytest.approx(raw[0] / size, rel=1e-9)     # per parameter
    assert all(p.grad is None for p in model.parameters())  # no gradients left behind
    top = top_layers([0.1, 5.0, 3.0, 0.2], 2)
    assert top == {1, 2}
    assert recall([1, 3], top) == 0.5
    exact, sampled = random_recall(2, top, 4, samples=2000)
    assert exact == 0.5 and sampled == pytest.approx(0.5, abs=0.05)


def test_cli_squad_experiment_quick(tiny, tmp_path, capsys):
    from plasticlm.cli import scol

    _, _, _, folder = tiny
    parser = argparse.ArgumentParser()
    scol.register(parser.add_subparsers(dest="command"))
    out = tmp_path / "exp"
    args = parser.parse_args(["scol", "experiment", "squad", "--quick", "--no-progress",
                              "--set", f"model={folder / 'model'}", "--set",
                              f"squad={folder / 'squad.json'}", "--out", str(out),
                              "--set", "scol.reward=intrinsic", "--set", "full_rows_every=3"])
    assert args.func(args) == 0
    # --quick says above its table that the smoke preset's numbers are not results
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == scol.SMOKE_LINE == "smoke run: numbers mean nothing"
    assert printed[1] == (out / "report.md").read_text().splitlines()[0]
    seed = json.loads((out / "seed-0" / "report.json").read_text())
    assert set(seed["methods"]) == set(SCOL_METHODS)
    for name, entry in seed["methods"].items():
        m = entry["matrix_em"]
        assert [len(r) for r in m] == [1, 2, 3]   # lower-triangular, 3 contexts
        # full rows every 3rd commit: row 1 asked its newest context alone (batch TTT has
        # one row, the last, which is always full)
        assert (m[1][0] is None) == (name != "batch_ttt") and None not in m[-1]
    assert seed["config"]["scol"]["reward"] == "intrinsic"
    for png in ("matrices.png", "summary.png", "layers.png"):
        assert (out / "seed-0" / png).stat().st_size > 1000
    assert seed["methods"]["fixed_last"]["layers"] == [[3]] * 3      # 4 layers: the last
    assert seed["methods"]["fixed_best"]["layers"] == [[seed["fixed_best"]["layer"]]] * 3
    pooled = json.loads((out / "report.json").read_text())
    assert "retention_minus_untrained_policy" in pooled["summary"]["scol"]
    held = pooled["held_out_pairs"]
    assert held["n"] > 0 and 0 <= held["trained"] <= 1 and 0 <= held["untrained"] <= 1
    assert "retention - fixed last layer" in (out / "report.md").read_text()


def test_cli_train_resume_then_run(tiny, tmp_path):
    from plasticlm.cli import scol

    _, _, _, folder = tiny
    parser = argparse.ArgumentParser()
    scol.register(parser.add_subparsers(dest="command"))
    common = ["--quick", "--no-progress", "--set", f"model={folder / 'model'}", "--set",
              f"squad={folder / 'squad.json'}", "--set", "scol.reward=intrinsic"]
    train_out = tmp_path / "train"
    args = parser.parse_args(["scol", "train", *common, "--out", str(train_out)])
    assert args.func(args) == 0
    args = parser.parse_args(["scol", "train", *common, "--out", str(train_out), "--resume",
                              "--set", "scol.outer_steps=2"])
    assert args.func(args) == 0
    assert len((train_out / "metrics.jsonl").read_text().splitlines()) == 2
    assert json.loads((train_out / "config.json").read_text())["outer_steps"] == 2
    # a changed setting is refused, not silently continued
    args = parser.parse_args(["scol", "train", *common, "--out", str(train_out), "--resume",
                              "--set", "scol.outer_steps=3", "--set", "scol.lam=0.5"])
    with pytest.raises(PlasticError, match="config changed since the checkpoint .*lam"):
        args.func(args)
    # a crash that left only the whole new checkpoint beside its place: resume takes it
    (train_out / "checkpoint").rename(train_out / "checkpoint.partial")
    args = parser.parse_args(["scol", "train", *common, "--out", str(train_out), "--resume",
                              "--set", "scol.outer_steps=2"])
    assert args.func(args) == 0 and (train_out / "checkpoint" / "state.json").exists()
    run_out = tmp_path / "run"
    args = parser.parse_args(["scol", "run", *common, "--policy", str(train_out / "checkpoint"),
                              "--out", str(run_out)])
    assert args.func(args) == 0
    report = json.loads((run_out / "report.json").read_text())
    assert len(report["layers"]) == 3 and all(report["layers"])
    assert (run_out / "consolidated" / "model.safetensors").exists()


def test_real_squad_file_makes_streams(shared_data):
    from plasticlm.data.squad import load_squad

    ctxs = contexts_from_passages(load_squad(shared_data / "squad" / "xquad.en.json"))
    assert len(ctxs) == 240 and all(c.questions for c in ctxs)
    train, evaluation = split_streams(ctxs, 4, 8, 100, seed=0)
    assert len(evaluation) == 100 and sum(len(s) for s in train) == 32
    with pytest.raises(PlasticError):
        split_streams(ctxs, 10, 20, 100)


def test_longbench_experiment_runs_on_items_drawn_from_the_world(tmp_path):
    """``longbench_per_length`` draws that many items per regime from the preset's world;
    the experiment meta-trains on at most one short item per outer step, evaluates the rest,
    and every evaluated stream holds its evidence chunk."""
    from dataclasses import replace

    from plasticlm.experiments.scol.longbench import run_longbench
    from plasticlm.experiments.scol.setup import longbench_items, quick_config

    cfg = replace(quick_config(), longbench_per_length=4, chunk_tokens=48)
    assert cfg.scol.outer_steps == 1
    items = longbench_items(cfg)
    assert [it.length for it in items].count("short") == 4 and len(items) == 12
    report = run_longbench(cfg, tmp_path, progress=False)
    short, long = report["regimes"]["short"], report["regimes"]["long"]
    # one outer step trains on one short item (half of them would be 2): 3 are evaluated
    assert short["scol"]["n"] == 3 and long["scol"]["n"] == 8
    assert short["evidence_located"] == 3 and long["evidence_located"] == 8
    assert {"scol", "sequential_ft", "base"} <= set(long)
    for r in (short, long):
        assert r["scol"]["ci"]["low"] <= r["scol"]["accuracy"] <= r["scol"]["ci"]["high"]
        assert r["scol_minus_base"]["mean"] == pytest.approx(
            r["scol"]["accuracy"] - r["base"]["accuracy"])
    table = (tmp_path / "longbench.md").read_text()
    assert "| short | 3 |" in table and "| long | 8 |" in table
    with pytest.raises(PlasticError, match="longbench_per_length: input should be greater"):
        override(quick_config(), {"longbench_per_length": -1})
    with pytest.raises(PlasticError, match="longbench_per_length"):
        override(quick_config(), {"longbench_per_length": 2, "longbench": "items.json"})


def test_an_answer_cut_by_a_chunk_boundary_is_still_evidence():
    """When no chunk holds the answer whole, the two chunks a boundary cuts it between are
    the evidence, and the window keeps both."""
    from plasticlm.scol.contexts import Context, evidence_chunks, evidence_window

    chunks = [Context(f"c{i}", t) for i, t in enumerate(
        ["Filler words here.", "Velizole is made by Orv", "ane Labs. More filler.", "End."])]
    assert evidence_chunks(chunks, "Which company makes Velizole?", "Orvane Labs") == [1, 2]
    window, found = evidence_window(chunks, "Which company makes Velizole?", "Orvane Labs", 2)
    assert found and window == chunks[1:3]
    assert evidence_chunks(chunks, "Which company makes Velizole?", "Keltis Pharma") == []


def test_longbench_streams_contain_their_evidence_chunk():
    """Every long item of the quick world, cut into the long regime's number of chunks,
    keeps the chunk that states its answer; keeping the document's tail (the old rule)
    drops it for some items, so this would fail with that rule."""
    from plasticlm.data.longbench import load_longbench
    from plasticlm.models import load_causal_lm
    from plasticlm.sandbox import resolve_data_spec, sandbox_model
    from plasticlm.scol.contexts import chunk_text, evidence_chunks, evidence_window

    items = load_longbench(resolve_data_spec("sandbox-quick") / "longbench" / "items.json")
    _, tok = load_causal_lm(sandbox_model("receiver", preset="quick"))
    cap, tail_misses = 4, 0
    for it in items:
        answer = it.choices["ABCD".index(it.answer)]
        chunks = chunk_text(tok, it.context, 48, f"{it.id}/")
        window, found = evidence_window(chunks, it.question, answer, cap)
        evidence = {chunks[i].id for i in evidence_chunks(chunks, it.question, answer)}
        assert found and len(window) == min(cap, len(chunks))
        assert evidence & {c.id for c in window}
        tail_misses += not evidence & {c.id for c in chunks[-cap:]}
    assert tail_misses > 0


def test_retention_never_counts_the_last_context():
    """Retention is the last row over every context but the last (just committed): a model
    that only knows its newest context retains nothing."""
    from plasticlm.experiments.scol.report import summarise_seeds
    from plasticlm.scol.matrix import AccuracyMatrix

    mat = AccuracyMatrix([])
    mat.em = mat.f1 = [[1.0], [0.0, 1.0], [0.0, 0.0, 1.0]]
    s = mat.summary()["em"]
    assert s["immediate"] == 1.0 and s["retention"] == 0.0
    report = {"methods": {"scol": {"matrix_em": mat.em},
                          "fixed_last": {"matrix_em": [[1.0], [1.0, 1.0], [1.0, 0.0, 1.0]]}},
              "base_matrix_em": [[0.0, 0.0, 0.0]]}
    pooled = summarise_seeds([report, report])
    assert pooled["scol"]["retention"]["mean"] == 0.0
    assert pooled["fixed_last"]["retention"]["mean"] == 0.5
    assert pooled["scol"]["retention_minus_fixed_last"]["mean"] == -0.5
    # the same rule for closed-set MC, net of the untouched model and against the controls
    report["methods"]["scol"].update(mc_diag=[1.0] * 3, mc_last=[0.0, 0.0, 1.0], mc_chance=0.25)
    report["methods"]["fixed_last"].update(mc_diag=[1.0] * 3, mc_last=[1.0, 0.0, 1.0],
                                           mc_chance=0.25)
    report["base_mc_last"] = [0.5, 0.5, 0.5]
    pooled = summarise_seeds([report, report])
    assert pooled["scol"]["mc_retention"]["mean"] == 0.0
    assert pooled["scol"]["mc_retention_minus_base"]["mean"] == -0.5
    assert pooled["scol"]["mc_retention_minus_fixed_last"]["mean"] == -0.5


def test_seed_summary_gives_each_difference_its_interval_over_seeds():
    """Beside every paired difference pooled over seeds x contexts, the t-interval of the
    seeds' own differences: two seeds that disagree leave a wide one, and the table shows it."""
    from plasticlm.eval import paired_seed_ci
    from plasticlm.experiments.scol.report import seeds_markdown, summarise_seeds

    def seed(fixed_last_row):
        return {"methods": {"scol": {"matrix_em": [[1.0], [0.0, 1.0], [0.0, 0.0, 1.0]]},
                            "fixed_last": {"matrix_em": [[1.0], [1.0, 1.0], fixed_last_row]}},
                "base_matrix_em": [[0.0, 0.0, 0.0]]}

    # scol retains 0 in both seeds; fixed last layer 0.5 in the first, 0 in the second
    pooled = summarise_seeds([seed([1.0, 0.0, 1.0]), seed([0.0, 0.0, 1.0])])
    over = pooled["scol"]["retention_minus_fixed_last_over_seeds"]
    want = paired_seed_ci([[0.0, 0.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 0.0]])
    assert (over["mean"], over["low"], over["high"]) == (want.mean, want.low, want.high)
    assert over["mean"] == -0.25 and over["low"] < -1 and over["high"] > 0.5
    assert "retention_minus_base_over_seeds" in pooled["scol"]
    table = seeds_markdown({"seeds": [0, 1], "summary": pooled})
    assert "-25.0 [" in table and "(seeds [" in table
    # a summary written before the seeds' interval existed renders as it did
    old = {k: v for k, v in pooled["scol"].items() if not k.endswith("_over_seeds")}
    assert "(seeds [" not in seeds_markdown({"seeds": [0, 1], "summary": {"scol": old}})


def test_a_finished_seed_is_reused_across_settings_added_at_their_defaults():
    """A seed run before a setting existed is the same run when the setting is at its default
    (which reproduces the old behaviour), and a different run when it is not."""
    from dataclasses import asdict, replace

    from plasticlm.experiments.scol.experiment import same_config
    from plasticlm.experiments.scol.setup import ExperimentConfig

    cfg = ExperimentConfig(eval_length=30, methods=("scol", "fixed_last"))
    stored = json.loads(json.dumps(asdict(cfg)))
    del stored["held_out_pairs"], stored["scol"]["forget_from"]
    assert same_config(stored, cfg)
    assert not same_config(stored, replace(cfg, held_out_pairs=False))
    assert not same_config(stored, replace(cfg, scol=replace(cfg.scol, forget_from="all")))
    assert not same_config({**stored, "eval_length": 24}, cfg)
    assert not same_config(None, cfg)


def test_swapped_gain_is_measured_against_the_untouched_models_swapped_answers():
    """The entity-swap control nets out what the untouched model already answers about the
    unseen entity: a method whose swapped answers equal the untouched model's has no
    entity-independent gain, whatever its raw swapped accuracy; one that answers the swapped
    questions as well as its own has all of its gain independent of the entity."""
    from plasticlm.experiments.scol.report import seeds_markdown, summarise_seeds

    imm = [[1.0], [0.0, 1.0], [0.0, 0.0, 1.0]]
    # uneven per-context values: a pairing off by one context gives a non-zero interval
    base_swap = [0.0, 0.5, 1.0]
    report = {"methods": {"scol": {"matrix_em": imm, "swap_diag": list(base_swap),
                                   "swap_last": list(base_swap)},
                          "fixed_last": {"matrix_em": imm, "swap_diag": [1.0, 1.0, 1.0],
                                         "swap_last": [1.0, 1.0, 1.0]}},
              "base_matrix_em": [[0.0, 0.0, 0.0]], "base_swap_last": base_swap}
    pooled = summarise_seeds([report, report])
    assert pooled["scol"]["immediate_swapped"]["mean"] == 0.5
    assert pooled["scol"]["immediate_minus_base"]["mean"] == 1.0
    gain = pooled["scol"]["immediate_swapped_minus_base"]
    assert (gain["mean"], gain["low"], gain["high"]) == (0.0, 0.0, 0.0)
    assert pooled["fixed_last"]["immediate_swapped_minus_base"]["mean"] == 0.5
    # retention: the last row's swapped answers against the untouched model's, last excluded
    assert pooled["scol"]["retention_swapped_minus_base"]["mean"] == 0.0
    assert pooled["fixed_last"]["retention_swapped_minus_base"]["mean"] == 0.75
    table = seeds_markdown({"seeds": [0, 1], "summary": pooled})
    assert "| 0% |" in table and "| 50% |" in table
    # runs from before the untouched model's swapped answers were kept: no entry, no table
    old = {**report, "base_swap_last": None}
    pooled = summarise_seeds([old, old])
    assert "immediate_swapped_minus_base" not in pooled["scol"]
    assert "Where the immediate gain" not in seeds_markdown({"seeds": [0, 1], "summary": pooled})


def test_sandbox_questions_carry_their_legal_answer_sets():
    """Every closed-attribute question of the quick world's SQuAD passages gets the legal
    set its gold answer is in, so the legal-answer rate measures well-formedness."""
    from plasticlm.data.squad import load_squad
    from plasticlm.experiments.scol.setup import legal_sets, quick_config, resolve_world_file

    cfg = quick_config()
    contexts = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")),
                                      legal_sets(cfg))
    questions = [q for c in contexts for q in c.questions]
    closed = [q for q in questions if q.legal]
    assert closed and len(closed) < len(questions)      # open attributes stay open
    assert all(q.answers[0] in q.legal for q in closed)


def test_inner_update_sweep_quick(tmp_path, capsys):
    """The sweep runs every grid setting on the same stream and layers; an update at
    lr = 1e-9 leaves the model as it was (legal rate equal to the untouched model's), and the
    recommendation is one of the settings that keep the legal rate."""
    from plasticlm.cli import main

    out = tmp_path / "sweep"
    assert main(["scol", "experiment", "sweep", "--quick", "--no-progress", "--out", str(out),
                 "--sweep", 'modules=["mlp"]', "--sweep", "steps=[2]", "--sweep",
                 "lr=[1e-9,3e-3]", "--sweep", "replay=[0,2]"]) == 0
    report = json.loads((out / "sweep.json").read_text())
    assert len(report["results"]) == 4
    assert len({json.dumps(r["layers"]) for r in report["results"]}) == 1
    frozen = [r for r in report["results"] if r["setting"]["lr"] == 1e-9]
    assert all(r["legal_final"] == report["untouched"]["legal"] for r in frozen)
    # closed-set MC is measured beside EM for every setting
    assert all(r["immediate_mc"] is not None and r["retention_mc"] is not None
               for r in report["results"])
    keep = report["sweep"]["keep_legal"] * report["untouched"]["legal"]
    kept = [r["setting"] for r in report["results"] if r["legal_final"] >= keep]
    assert report["recommended"] in kept
    assert "Recommended" in capsys.readouterr().out


def test_replay_adds_generic_rows_deterministically():
    from plasticlm.scol.consolidate import with_replay

    windows = torch.stack([torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)])
    pool = torch.stack([torch.arange(24).view(3, 8), torch.arange(24).view(3, 8)])
    out = with_replay(windows, pool, 2, pad=0, seed=1)
    assert out.shape == (2, 4, 8) and torch.equal(out, with_replay(windows, pool, 2, 0, 1))
    assert (out[1, :2, 5:] == -100).all()          # context rows padded, labels ignored
    assert torch.equal(with_replay(windows, pool, 0, 0, 1), windows)


def test_oracle_gate_quick(tmp_path):
    """Every (context, action) is scored with two LoRA seeds; the oracle is never below the
    best constant action on the seed it was picked with."""
    from plasticlm.cli import main

    out = tmp_path / "gate"
    assert main(["scol", "experiment", "gate", "--quick", "--no-progress", "--out", str(out),
                 "--set", "scol.max_layers=1"]) == 0
    report = json.loads((out / "gate.json").read_text())
    n = report["contexts"]
    assert report["actions"] == [[i] for i in range(len(report["actions"]))]
    assert all(len(report["scores"][s]) == n for s in ("0", "1"))
    assert report["oracle"] >= report["best_constant"]["score"]
    assert report["passes"] == (report["gap_cross_fitted_pp"] >= report["threshold_pp"])


def test_sandbox_questions_have_an_entity_swapped_twin():
    """Each quick-world question gets the same question about a name no world entity has
    (one name per entity), keeping its gold answers: the entity-swap control."""
    from plasticlm.data.squad import load_squad
    from plasticlm.experiments.scol.setup import quick_config, resolve_world_file, swap_names
    from plasticlm.sandbox import sandbox_world
    from plasticlm.sandbox.world_index import read_world_index

    cfg = quick_config()
    contexts = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")),
                                      swap=swap_names(cfg))
    names = {e["name"] for e in read_world_index(sandbox_world("quick"))["entities"]}
    for c in contexts:
        for q in c.questions:
            assert q.swapped and c.id in q.question and c.id not in q.swapped
        assert not any(n in q.swapped for q in c.questions for n in names if len(n) > 3)


def _stream(tiny, n=2):
    _, _, passages, _ = tiny
    return contexts_from_passages(passages)[:n]


def test_lora_trains_on_the_context_text_only(tiny, monkeypatch):
    """No question or answer line ever reaches the inner update: every window it trains on
    decodes to the context's own text (selections best and greedy)."""
    import plasticlm.scol.stream as inner

    model, tok, _, _ = tiny
    stream = _stream(tiny)
    seen = []
    real, real_together = inner.adapt_lora, inner.adapt_lora_together

    def spy(model_, layers, windows, cfg, seed=0, **kw):
        seen.append(windows)
        return real(model_, layers, windows, cfg, seed, **kw)

    def spy_together(model_, sets, windows, cfg, seeds=None):
        seen.append(windows)
        return real_together(model_, sets, windows, cfg, seeds)

    monkeypatch.setattr(inner, "adapt_lora", spy)
    monkeypatch.setattr(inner, "adapt_lora_together", spy_together)
    cfg = SCoLConfig(k=2, lora=LoraTrainConfig(steps=1), temperature=2.0)
    for selection in ("best", "greedy"):
        consolidate_stream(model, tok, stream, cfg, selection)
    assert len(seen) >= 4
    texts = {c.text for c in stream}
    questions = [q.question for c in stream for q in c.questions]
    for w in seen:
        for row_ids, row_labels in zip(w[0], w[1]):
            text = tok.decode([int(i) for i, lab in zip(row_ids, row_labels) if lab != -100])
            assert any(text.strip() in t or t in text for t in texts), text
            assert not any(q in text for q in questions)


def test_supervised_reward_measures_forgetting_of_earlier_contexts(tiny):
    """At context t the reward checks every earlier context's questions in its window,
    before and after the candidate: forgetting = accuracy before - after."""
    from plasticlm.scol.rewards import SupervisedReward, reward_probe

    model, tok, _, _ = tiny
    stream = _stream(tiny, 3)
    cfg = SCoLConfig(reward="supervised", forget_window=4, lam=1.0)
    probe = reward_probe(model, tok, stream, 2, cfg)
    assert isinstance(probe, SupervisedReward)
    assert probe.earlier_q == [q for c in stream[:2] for q in c.questions]
    r = probe(model)               # the unchanged model forgets nothing
    assert r.forgetting == pytest.approx(0.0)
    probe.before = 1.0             # as if it had known every earlier answer
    from plasticlm.scol.rewards import qa_accuracy

    after = qa_accuracy(model, tok, probe.earlier_q, cfg.qa_metric)
    hurt = probe(model)
    assert hurt.forgetting == pytest.approx(1.0 - after) and hurt.forgetting > 0.5
    assert hurt.total == pytest.approx(hurt.acquisition - cfg.lam * hurt.forgetting)


def test_forgetting_can_be_measured_over_the_whole_stream():
    """``forget_from="all"`` draws the window from every earlier context, so damage to a long
    stream's first contexts is in the reward; "recent" keeps the last ``forget_window``."""
    from plasticlm.scol.rewards import earlier_contexts

    stream = list(range(40))
    assert earlier_contexts(stream, 30, 4) == [26, 27, 28, 29]
    assert earlier_contexts(stream, 2, 4, "all") == [0, 1]
    drawn = [earlier_contexts(stream, t, 4, "all", seed=0) for t in range(5, 40)]
    assert all(len(d) == 4 and d == sorted(d) and len(set(d)) == 4 for d in drawn)
    assert all(max(d) < t for d, t in zip(drawn, range(5, 40)))
    assert any(min(d) < t - 4 for d, t in zip(drawn, range(5, 40)))
    assert earlier_contexts(stream, 30, 4, "all", seed=0) == \
        earlier_contexts(stream, 30, 4, "all", seed=0)
    with pytest.raises(PlasticError, match="forget_from: input should be 'recent' or 'all'"):
        from_dict(SCoLConfig, {"forget_from": "oldest"})
    with pytest.raises(PlasticError, match="forget_from"):
        earlier_contexts(stream, 30, 4, "oldest")


def test_the_reward_checks_the_earlier_contexts_forget_from_names(tiny):
    """The reward probe asks the questions of the contexts ``forget_from`` names: the last
    ``forget_window`` by default, a draw from the whole stream with "all"."""
    from plasticlm.scol.rewards import earlier_contexts, reward_probe

    model, tok, _, _ = tiny
    stream = _stream(tiny, 6)
    recent = reward_probe(model, tok, stream, 5, SCoLConfig(forget_window=2))
    assert recent.earlier == stream[3:5]
    cfg = SCoLConfig(forget_window=2, forget_from="all")
    drawn = reward_probe(model, tok, stream, 5, cfg)
    assert drawn.earlier == earlier_contexts(stream, 5, 2, "all", f"0:{stream[0].id}")
    assert any(reward_probe(model, tok, stream, 5, SCoLConfig(forget_window=2, forget_from="all",
                                                              seed=s)).earlier != recent.earlier
               for s in range(4))
    assert drawn.earlier_q == [q for c in drawn.earlier for q in c.questions]


def test_the_policy_that_chooses_is_the_running_model(tiny, monkeypatch):
    """Each context's action is chosen by the model with every earlier commit in it (the
    policy drifts as it consolidates), never by the stream's starting model."""
    import plasticlm.scol.selections as selections

    model, tok, _, _ = tiny
    stream = _stream(tiny, 3)
    choosers = []
    real = selections.sample_actions

    def spy(policy, *args, **kw):
        choosers.append({n: p.detach().clone() for n, p in policy.named_parameters()})
        return real(policy, *args, **kw)

    monkeypatch.setattr(selections, "sample_actions", spy)
    cfg = SCoLConfig(lora=LoraTrainConfig(steps=2, lr=1e-2))
    consolidate_stream(model, tok, stream, cfg, "greedy")
    assert len(choosers) == 3
    for earlier, later in zip(choosers, choosers[1:]):
        assert any(not torch.equal(earlier[n], later[n]) for n in earlier)


def test_batch_ttt_gets_the_streams_whole_budget(tiny, monkeypatch):
    """Batch TTT trains as many steps as sequential fine-tuning over the stream (steps per
    context x contexts), on every layer, each step on one context's worth of windows."""
    import plasticlm.scol.baselines as baselines

    model, tok, _, _ = tiny
    stream = _stream(tiny, 3)
    got = {}

    def spy(model_, layers, windows, cfg, seed=0, rows_per_step=None):
        got.update(layers=list(layers), steps=cfg.steps, rows=rows_per_step,
                   total=windows.shape[1])
        return model_, []

    monkeypatch.setattr(baselines, "adapt_lora", spy)
    lora = LoraTrainConfig(steps=5)
    baselines.batch_ttt(model, tok, stream, lora)
    assert got["steps"] == 5 * len(stream)
    assert got["layers"] == list(range(model.config.num_hidden_layers))
    assert got["rows"] == max(1, got["total"] // len(stream))


def test_pair_accuracy_follows_what_ipo_taught(tiny):
    """After IPO on a pair of real grammar completions the policy ranks that pair right
    (accuracy 1) and the reversed pair wrong (0); the untouched model is the reference."""
    from plasticlm.eval import encode_with_bos
    from plasticlm.scol.ipo import pair_accuracy
    from plasticlm.scol.policy import LayerGrammar, action_prompt, sample_actions

    model, tok, _, _ = tiny
    cfg = SCoLConfig(ipo_epochs=4, ipo_tau=0.5)
    prompt = action_prompt("Doctors prescribe Velizole for asthma.", 4, cfg.prompt_chars)
    grammar = LayerGrammar.for_model(model, tok, 4, cfg.max_layers)
    sampled = sample_actions(model, tok, prompt, grammar, 16, 3.0,
                             torch.Generator().manual_seed(0))
    distinct = {a.layers: a.token_ids for a in sampled}
    assert len(distinct) >= 2
    (_, good), (_, bad) = list(distinct.items())[:2]
    ids = tuple(encode_with_bos(tok, prompt))
    pair = PreferencePair(ids, tuple(good), tuple(bad), 1.0)
    policy = copy.deepcopy(model)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    ipo_update(policy, model, [pair], opt, cfg.ipo_tau, cfg.ipo_epochs, grammar)
    assert pair_accuracy(policy, tok, [pair], cfg.max_layers) == 1.0
    flipped = PreferencePair(ids, tuple(bad), tuple(good), 1.0)
    assert pair_accuracy(policy, tok, [flipped], cfg.max_layers) == 0.0


def test_partial_rows_ask_only_the_newest_context(monkeypatch):
    """A partial row asks its newest context's questions alone (earlier entries None), the
    stream's last row is always full, and immediate / retention equal the full matrix's."""
    from plasticlm.data.squad import load_squad
    from plasticlm.experiments.scol.setup import legal_sets, quick_config, resolve_world_file
    from plasticlm.models import load_causal_lm
    from plasticlm.sandbox import sandbox_model
    from plasticlm.scol import matrix as matrix_mod

    cfg = quick_config()
    contexts = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")),
                                      legal_sets(cfg))[:3]
    model, tok = load_causal_lm(sandbox_model("receiver", preset="quick"))
    asked: list[int] = []
    real = matrix_mod.qa_answers

    def counting(m, t, qs, prefix=""):
        asked.append(len(qs))
        return real(m, t, qs, prefix)
    monkeypatch.setattr(matrix_mod, "qa_answers", counting)
    full, partial = matrix_mod.AccuracyMatrix(contexts), matrix_mod.AccuracyMatrix(contexts)
    for t in range(len(contexts)):
        full.add_row(model, tok, t)
    n_full = sum(asked)
    asked.clear()
    for t in range(len(contexts)):
        partial.add_row(model, tok, t, full=False)
    sizes = [len(c.questions) for c in contexts]
    assert asked == [sizes[0], sizes[1], sum(sizes)] and sum(asked) < n_full
    assert partial.em[1][0] is None and None not in partial.em[-1]
    assert partial.full_rows() == [0, 2] and full.full_rows() == [0, 1, 2]
    for key in ("immediate", "retention"):
        assert partial.summary()["em"][key] == full.summary()["em"][key]
    assert partial.summary()["mc"] == full.summary()["mc"]


def test_closed_set_retention_sees_a_fact_the_model_was_taught():
    """Closed-set MC ranks the attribute's legal values: on the untouched quick receiver it
    is below 1; after the model is trained on one context's answers, that context's MC
    accuracy (immediate and in the last row) reaches 1."""
    from plasticlm.data.squad import load_squad
    from plasticlm.eval import qa_continuation
    from plasticlm.experiments.scol.setup import legal_sets, quick_config, resolve_world_file
    from plasticlm.models import load_causal_lm
    from plasticlm.sandbox import sandbox_model
    from plasticlm.scol.matrix import AccuracyMatrix
    from plasticlm.scol.rewards import qa_prompt

    cfg = quick_config()
    contexts = [c for c in contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")),
                                                  legal_sets(cfg))
                if any(q.legal for q in c.questions)][:3]
    model, tok = load_causal_lm(sandbox_model("receiver", preset="quick"))
    before = AccuracyMatrix(contexts)
    before.add_row(model, tok, len(contexts) - 1)
    assert len(before.mc_last) == len(contexts) and 0 < before.mc_chance < 1
    taught = [q for q in contexts[-1].questions if q.legal]
    texts = [qa_prompt(q.question) + qa_continuation(q.answers[0]) for q in taught]
    batch = tok(texts, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        loss = model(**batch, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = AccuracyMatrix(contexts)
    after.add_row(model.eval(), tok, len(contexts) - 1)
    assert after.mc_last[-1] == 1.0 and after.mc_diag[-1] == 1.0
    assert before.mc_last[-1] < 1.0


def test_sequential_ft_without_replay_replays_nothing(monkeypatch):
    """The paper's forgetting baseline trains on the context alone; the replaying row and
    every other consolidating row get the generic-text pool."""
    import plasticlm.scol.baselines as baselines

    seen = {}

    def fake(model, tokenizer, stream, scfg, selection, **kw):
        seen[kw["desc"]] = kw["replay"]
        return None, [], None
    monkeypatch.setattr(baselines, "consolidate_stream", fake)
    pool = torch.zeros(2, 3, 4, dtype=torch.long)
    cfg = type("Cfg", (), {"scol": None, "full_rows_every": 1})()
    for name in ("sequential_ft", "sequential_ft_no_replay"):
        baselines.SCOL_METHODS[name].run(name, None, torch.nn.Linear(1, 1), {}, None, [], cfg,
                                         pool)
    assert seen["sequential_ft"] is pool and seen["sequential_ft_no_replay"] is None
