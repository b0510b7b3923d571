"""FedNL beyond the window: windowed baselines, open-book and NIAH clients, theta-only recall
on a frozen base, and ``fednl experiment`` end to end on Flower (quick preset)."""

import json
from pathlib import Path

import pytest
import torch

from plasticlm.config import from_dict, override
from plasticlm.errors import PlasticError
from plasticlm.fednl.config_sections import MemoryOptions, MethodConfig
from plasticlm.fednl.methods import prepare_model
from plasticlm.models import build_tiny


def _tiny(vocab: int = 64):
    torch.manual_seed(0)
    return build_tiny("qwen3", vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=2,
                      num_kv_heads=1)


@pytest.mark.parametrize("method", ["fedavg", "fedavg-full"])
def test_windowed_baseline_cannot_see_beyond_its_window(method):
    """At window 4 the last position's output ignores a token 8 back; at window 0 (full
    attention) the same change moves it: the equal-state baseline really is windowed."""
    ids = torch.randint(1, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, 3] = (ids[0, 3] % 63) + 1
    outputs = {}
    for window in (4, 0):
        model = prepare_model(_tiny(), MethodConfig(name=method, window=window),
                              MemoryOptions()).eval()
        with torch.no_grad():
            outputs[window] = [model(input_ids=x).logits[0, -1] for x in (ids, changed)]
    assert torch.allclose(*outputs[4], atol=1e-6)
    assert not torch.allclose(*outputs[0], atol=1e-4)


def test_fednl_needs_a_window():
    with pytest.raises(PlasticError, match="window > 0"):
        prepare_model(_tiny(), MethodConfig(name="fednl", window=0), MemoryOptions())


@pytest.fixture(scope="module")
def quick_world():
    from plasticlm.sandbox import resolve_data_spec

    return resolve_data_spec("sandbox-quick")


def test_openbook_clients_are_tested_on_entities_they_never_trained_on(quick_world):
    from plasticlm.fednl.clients import client_tasks

    tasks = client_tasks(quick_world, split="openbook")
    assert len(tasks) == 5 and len({t.domain for t in tasks}) == 5
    for t in tasks:
        assert t.train and t.test
        assert not {it.entity for it in t.train} & {it.entity for it in t.test}
        assert {it.domain for it in t.train + t.test} == {t.name}
        assert all(it.entity in it.context.split("\n")[0] for it in t.test)
        prompt, answer = t.pairs()[0]
        assert prompt.rstrip().endswith("A:") and answer.strip() in t.train[0].choices
        assert len(t.groups()) == len(t.test)


def test_closed_book_questions_make_up_their_share_of_each_clients_training(quick_world):
    """Each open-book client trains on its own domain's closed-book questions, ``share`` of
    its pairs, in the pre-training template, none of them a closed-book test question."""
    from plasticlm.eval import qa_continuation, qa_prompt
    from plasticlm.fednl.clients import (
        closed_book_test,
        has_closed_book_pool,
        openbook_tasks,
        with_closed_book,
        world_domains,
    )
    from plasticlm.fednl.config import FedNLConfig

    tasks = openbook_tasks(quick_world)
    mixed = with_closed_book(tasks, quick_world, 0.25, seed=0)
    mapping = world_domains(quick_world)
    for t, m in zip(tasks, mixed):
        k, n = len(t.item_pairs()), len(m.closed_book)
        assert m.item_pairs() == t.item_pairs() and n > 0
        assert abs(n / (n + k) - 0.25) <= 1 / (n + k)
        assert {mapping[q.subject] for q in m.closed_book} == {t.domain}
        assert m.pairs()[k:] == [(qa_prompt(q.question), qa_continuation(q.answer_text))
                                 for q in m.closed_book]
    test = closed_book_test(quick_world)
    assert test.test and not ({q.question for m in mixed for q in m.closed_book}
                              & {q.question for q in test.test})
    assert with_closed_book(tasks, quick_world, 0.0) is tasks
    # a run's config reaches its clients' data
    from plasticlm.fednl.build import tasks_for

    for split in ("openbook", "niah"):
        cfg = from_dict(FedNLConfig, {
            "model": "sandbox-quick:receiver",
            "data": {"split": split, "source": "sandbox-quick", "niah_length": 400,
                     "max_train": 4, "closed_book_share": 0.25}})
        assert all(t.closed_book for t in tasks_for(cfg))
    # the experiment's closed-book row, and only it, trains with them
    from plasticlm.experiments.fednl.experiment import _closed_book_cell
    from plasticlm.experiments.fednl.variants import ExperimentConfig, federated_config, variants

    ecfg = override(ExperimentConfig(), {"run.data.source": str(quick_world)})
    shares = {v.label: federated_config(ecfg, v, 0, quick_world).data.closed_book_share
              for v in variants(ecfg)}
    assert shares.pop("fednl, with closed-book questions") == ecfg.closed_book_row_share > 0
    assert set(shares.values()) == {0.0}
    # a folder of NIAH essays has no closed-book questions: no such row, nothing to score
    essays = quick_world.parent / "essays-only"
    assert not has_closed_book_pool(essays)
    assert "fednl, with closed-book questions" not in [
        v.label for v in variants(override(ExperimentConfig(), {"run.data.source": str(essays)}))]
    assert _closed_book_cell([{"correct": [1.0]}]) == "-"   # scored before the column existed
    with pytest.raises(PlasticError, match="closed-book already"):
        from_dict(FedNLConfig, {"data": {"split": "domain", "closed_book_share": 0.25}})
    with pytest.raises(PlasticError, match="data.closed_book_share: input should be less than 1"):
        from_dict(FedNLConfig, {"data": {"split": "niah", "closed_book_share": 1.0}})


def test_long_stream_settings_that_cannot_work_are_refused():
    from plasticlm.experiments.fednl.variants import ExperimentConfig

    with pytest.raises(PlasticError, match="at least one bucket"):
        ExperimentConfig(experiment="stream", stream_tokens=100, stream_questions=False)
    with pytest.raises(PlasticError, match="stream_questions=false"):
        ExperimentConfig(experiment="stream", stream_tokens=16384)


def test_long_streams_continue_each_domain_with_the_others(quick_world):
    from transformers import AutoTokenizer

    from plasticlm.data.context_tasks import load_client_streams
    from plasticlm.experiments.fednl.streaming import long_streams
    from plasticlm.sandbox import sandbox_model

    streams = load_client_streams(quick_world / "client_streams.jsonl")
    tok = AutoTokenizer.from_pretrained(sandbox_model("receiver", "quick"))
    assert long_streams(streams, 0, tok) is streams
    names = list(streams)
    size = {n: len(tok("\n".join(s.text for s in segs), add_special_tokens=False)["input_ids"])
            for n, segs in streams.items()}
    want = sum(size.values()) + 1   # more than all five: the own stream comes round again
    for i, (name, segs) in enumerate(long_streams(streams, want, tok).items()):
        assert name == names[i]
        order = [names[(i + j) % len(names)] for j in range(len(names) + 1)]
        assert segs == [s for n in order for s in streams[n]]


def test_every_niah_client_scores_by_choice(quick_world):
    """All seven NIAH tasks get four options per sample, word answers included (decoys from
    other samples' answers), and a score per held-out sample."""
    from plasticlm.fednl.clients import niah_tasks
    from plasticlm.models import load_causal_lm
    from plasticlm.sandbox import sandbox_model

    model, tok = load_causal_lm(sandbox_model("receiver", "quick"))
    tasks = niah_tasks(quick_world, tok, length=400, train_per_client=2, test_per_client=6)
    assert len(tasks) == 7
    for t in tasks:
        scores = t.correct(model, tok)
        assert len(scores) == 6 and set(scores) <= {0.0, 1.0}


def _as_targets(labels: torch.Tensor) -> torch.Tensor:
    """MQAR labels sit on the position that predicts them; answer_loss wants them on the
    predicted token's own position."""
    out = torch.full_like(labels, -100)
    out[:, 1:] = labels[:, :-1]
    return out


@pytest.mark.slow   # 30-55 s on 2 cores: `make test-slow` (CI runs it after `make test`)
def test_theta_only_memory_recalls_beyond_the_window_of_a_frozen_base():
    """A frozen tiny base pre-trained on associative recall with full attention loses it at
    a 4-token window; training theta alone (memory LoRA, beta, gate) brings recall back
    well above the windowed base, and the same theta with its recurrence removed does not."""
    from plasticlm.experiments.memory.mqar import mqar_accuracy, mqar_batch
    from plasticlm.fednl.objective import answer_loss, param_groups
    from plasticlm.fednl.theta import trainable

    vocab, seq, kv = 32, 24, 3

    def tiny():
        return build_tiny("llama", vocab_size=vocab, hidden_size=64, num_layers=2,
                          num_heads=2, num_kv_heads=2)

    def train(model, groups, steps: int, lr: float, seed: int) -> None:
        opt, gen = torch.optim.AdamW(groups, lr=lr), torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(steps):
            ids, labels = mqar_batch(32, seq, kv, vocab, gen)
            loss = answer_loss(model, ids, _as_targets(labels))
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()

    torch.manual_seed(0)
    base = tiny()
    train(base, base.parameters(), 1000, lr=3e-3, seed=0)
    state = {k: v.clone() for k, v in base.state_dict().items()}
    test_ids, test_labels = mqar_batch(256, seq, kv, vocab, torch.Generator().manual_seed(99))

    def accuracy(model) -> float:
        with torch.no_grad():
            return mqar_accuracy(model(input_ids=test_ids).logits, test_labels)

    def theta_trained(recurrent: bool | None):
        model = tiny()
        model.load_state_dict(state)
        from plasticlm.fednl.config import FedNLConfig

        cfg = override(FedNLConfig(), {
            "method.name": "fednl" if recurrent is not None else "fedavg",
            "method.window": 4, "memory.recurrent": bool(recurrent), "train.lr": 1e-2})
        model = prepare_model(model, cfg.method, cfg.memory).eval()
        if recurrent is not None:  # None: the windowed frozen base, untouched
            train(model, param_groups(trainable(model), cfg.train.gate_lr), 200,
                  lr=cfg.train.lr, seed=1)
        return accuracy(model)

    full = accuracy(base)
    window, memory, no_recurrence = theta_trained(None), theta_trained(True), theta_trained(False)
    assert full > 0.5, full          # measured 0.62 (chance 1/16)
    assert window < 0.3, window      # measured 0.14
    # measured: memory 0.55, recurrence removed 0.13
    assert memory > window + 0.25 and memory > no_recurrence + 0.25, (window, memory,
                                                                      no_recurrence)


# the openbook runs the stream experiment reads too (full attention runs in the demo's test)
ROWS = 'rows=["fednl", "untrained, window"]'


@pytest.fixture(scope="module")
def quick_experiment(tmp_path_factory):
    from plasticlm.config import load_config, preset_path
    from plasticlm.experiments.fednl.variants import ExperimentConfig

    out = tmp_path_factory.mktemp("fx")

    def make(name: str, *overrides: str) -> ExperimentConfig:
        return load_config(ExperimentConfig, None, [f"out={out}", f"experiment={name}",
                                                    *overrides],
                           preset=preset_path("fednl", "experiment-quick"))
    return make


@pytest.mark.slow   # 55 s on 2 cores: `make test-slow` (CI runs it after `make test`)
def test_openbook_experiment_runs_its_variants_on_flower_and_resumes(quick_experiment,
                                                                      monkeypatch):
    """FedNL, the windowed FedAvg reference and the untrained model on Flower (the decay and
    no-recurrence rows differ from FedNL's only in its config; full attention runs in the
    demo's test)."""
    from plasticlm.experiments.fednl.experiment import run_experiment
    from plasticlm.experiments.fednl.variants import variants
    from plasticlm.fednl import run as fed_run

    cfg = quick_experiment("openbook", ROWS)
    results = run_experiment(cfg, progress=False)
    labels = [v.label for v in variants(cfg)]
    assert set(results["runs"]) == {f"{v}|0" for v in labels}
    for label in labels:
        r = results["runs"][f"{label}|0"]
        assert len(r["correct"]) == len(r["groups"]) > 0
        assert ("drop" in r) == (label != "untrained, window")
    for label in labels:
        assert f"| {label} |" in results["table"]
        r = results["runs"][f"{label}|0"]
        assert len(r["closed_book"]) == len(r["closed_book_groups"]) > 0
    assert "closed-book [95% CI]" in results["table"]
    folder = Path(cfg.out) / "openbook"
    assert (folder / "accuracy.png").stat().st_size > 0
    assert json.loads((folder / "results.json").read_text())["table"] == results["table"]
    # a re-run with the same config continues from results.json: no federation runs again
    monkeypatch.setattr(fed_run, "run_federated",
                        lambda *a, **k: pytest.fail("a finished run was run again"))
    assert run_experiment(cfg, progress=False)["runs"] == results["runs"]
    # a finished run whose saved config predates a field (here: memory.decay) is reused too
    from plasticlm.experiments.fednl.variants import federated_config, trained_model

    fednl = next(v for v in variants(cfg) if v.label == "fednl")
    fcfg = federated_config(cfg, fednl, 0, folder)
    saved = folder / fcfg.name / "config.json"
    old = json.loads(saved.read_text())
    del old["memory"]["decay"]
    saved.write_text(json.dumps(old))
    assert trained_model(fcfg, True, progress=False)[2] is not None


@pytest.mark.slow   # 52 s on 2 cores with the shared quick experiment: `make test-slow`
def test_stream_memory_and_comm_experiments(quick_experiment):
    from plasticlm.experiments.fednl.experiment import run_experiment

    stream = run_experiment(quick_experiment("stream", ROWS), progress=False)
    assert {"fednl", "fedavg LoRA, window"} <= set(stream["variants"])
    for r in stream["variants"].values():
        assert r["normalised_ce"][0]["mean"] == pytest.approx(1.0)
        assert "questions" not in r  # the quick world's streams are too short to ask any
    assert "in-stream questions" in stream["table"]
    # read to 2048 tokens, past the end of each domain's own stream: 32 buckets of 64
    long = run_experiment(quick_experiment("stream", ROWS, "stream_tokens=2048",
                                           "stream_questions=false"), progress=False)
    for r in long["variants"].values():
        assert len(r["normalised_ce"]) == 2048 // 64
    assert "read to 2048 tokens" in long["table"]
    memory = run_experiment(quick_experiment("memory"), progress=False)
    small, large = memory["rows"]
    assert large["kv_bytes"] == pytest.approx(2 * small["kv_bytes"], rel=0.01)
    assert large["memory_bytes"] == small["memory_bytes"]
    comm = run_experiment(quick_experiment("comm"), progress=False)
    b = comm["bytes"]
    nl = next(v for k, v in b.items() if k.startswith("fednl"))
    same_bytes = next(v for k, v in b.items() if "FedNL's bytes" in k)
    full = next(v for k, v in b.items() if k.startswith("fedavg-full"))
    assert abs(same_bytes - nl) <= nl / comm["rank_for_equal_bytes"] / 2 + 1
    assert full > 5 * nl


def test_in_stream_questions_are_scored_from_the_stream_state():
    """Each choice is scored where the question stands, after everything before it and
    nothing else: equal to the parallel windowed forward over the stream's text up to the
    question plus that choice (the state is restored between choices; the answered line then
    joins the stream)."""
    from plasticlm.data.context_tasks import StreamSegment
    from plasticlm.eval import qa_continuation, qa_line, qa_prompt
    from plasticlm.experiments.fednl.streaming import stream_questions
    from plasticlm.memory import attach_memory, meta_parameters
    from plasticlm.models import train_bpe_tokenizer

    texts = ["Velazole is a drug that acts on the liver.", "Ofloxin acts on the heart.",
             "Corvell was written in Kestmark."]
    tok = train_bpe_tokenizer(texts * 20, vocab_size=300)
    model = attach_memory(build_tiny("qwen3", vocab_size=len(tok), hidden_size=32,
                                     num_layers=2, num_heads=2, num_kv_heads=1, seed=3),
                          layers="all", window=4, rank=4)
    with torch.no_grad():  # a nonzero memory LoRA, so the memory carries something
        for name, p in meta_parameters(model).items():
            if ".B" in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.3)
    question = ("Which organ does Velazole act on?", "liver", ("heart", "liver", "lungs"))
    segments = [StreamSegment("text", texts[0]), StreamSegment("text", texts[1]),
                StreamSegment("question", question[0], answer=question[1],
                              choices=question[2]),
                StreamSegment("text", texts[2]),
                StreamSegment("question", question[0], answer=question[1],
                              choices=question[2])]
    asked = stream_questions(model, tok, segments, chunk_tokens=5)
    prefixes = ["\n".join(texts[:2]) + "\n" + qa_prompt(question[0]),
                "\n".join([*texts[:2], qa_line(question[0], question[1]), texts[2]]) + "\n"
                + qa_prompt(question[0])]
    for q, prefix in zip(asked, prefixes):
        for choice, score in zip(question[2], q["scores"]):
            ctx = [tok.bos_token_id, *tok(prefix, add_special_tokens=False)["input_ids"]]
            cont = tok(qa_continuation(choice), add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ctx + cont])).logits[0], -1)
            want = sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))
            assert score == pytest.approx(want, abs=1e-3)
        assert q["correct"] == float(max(range(3), key=q["scores"].__getitem__) == 1)
    assert asked[1]["tokens"] > asked[0]["tokens"]


def test_in_stream_summary_splits_each_stream_at_its_middle():
    from plasticlm.experiments.fednl.streaming import _question_summary

    def q(tokens, correct):
        return {"tokens": tokens, "correct": correct}

    # a stream's middle is half its last question's position: seed 0 answers 0/2 in the
    # first halves (10 of 40, 4 of 8) and 3/3 in the second; seed 1 1/2 and 1/2
    asked = [[[q(10, 0.0), q(30, 1.0), q(40, 1.0)], [q(4, 0.0), q(8, 1.0)]],
             [[q(10, 1.0), q(40, 0.0)], [q(2, 0.0), q(8, 1.0)]]]
    summary = _question_summary(asked)
    assert summary["questions"]["mean"] == pytest.approx(5 / 9)
    assert summary["late_minus_early"]["mean"] == pytest.approx((1.0 + 0.0) / 2)
    assert _question_summary([[[]], [[q(1, 1.0)]]]) == {}


def test_rows_pick_variants_and_old_results_still_match(tmp_path):
    import dataclasses
    import json

    from plasticlm.errors import PlasticError
    from plasticlm.experiments.fednl.experiment import _load_results
    from plasticlm.experiments.fednl.variants import ExperimentConfig, variants

    cfg = ExperimentConfig(experiment="niah", rows=("fednl", "fedavg LoRA, full attention"))
    assert [v.label for v in variants(cfg)] == ["fednl", "fedavg LoRA, window",
                                                "fedavg LoRA, full attention"]
    with pytest.raises(PlasticError, match="unknown rows"):
        variants(ExperimentConfig(experiment="niah", rows=("fedbogus",)))
    with pytest.raises(PlasticError, match="unknown rows"):   # the NIAH baselines are niah's
        variants(ExperimentConfig(experiment="openbook", rows=("fedprox",)))
    # results written before `rows` existed are still this config's
    old = {k: v for k, v in dataclasses.asdict(ExperimentConfig()).items() if k != "rows"}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"config": old, "runs": {"fednl|0": {}}}))
    assert _load_results(path, ExperimentConfig())["runs"] == {"fednl|0": {}}
    # each scored run is keyed by row and seed: more seeds or other rows keep it ...
    more = dataclasses.replace(ExperimentConfig(), seeds=9, rows=("fednl", "fedprox"))
    assert _load_results(path, more)["runs"] == {"fednl|0": {}}
    assert _load_results(path, more)["config"]["seeds"] == 9
    # ... any other setting scores again
    other = dataclasses.replace(ExperimentConfig(), closed_book_row_share=0.5)
    assert _load_results(path, other)["runs"] == {}


def test_accuracy_table_calls_a_difference_only_when_the_seeds_agree():
    """The verdict of a row against windowed FedAvg needs the items pooled over seeds and the
    seeds' own differences to exclude zero: a gain made by one seed of three is no difference.
    The paper's figures stand in the rows they belong to (FedNL 29.7, FedALA 28.6)."""
    from plasticlm.experiments.fednl.experiment import accuracy_table
    from plasticlm.experiments.fednl.variants import ExperimentConfig

    cfg = ExperimentConfig(experiment="niah", seeds=3, rows=("fednl", "fedala"))
    n = 200
    ref = [1.0] * 50 + [0.0] * (n - 50)

    def run(gains):
        return {"correct": [1.0 if i < 50 + gains else 0.0 for i in range(n)],
                "groups": list(range(n)), "theta_bytes": 1000}

    def table(gains_per_seed):
        runs = {}
        for s, g in enumerate(gains_per_seed):
            runs[f"fednl|{s}"] = runs[f"fedala|{s}"] = run(g)
            runs[f"fedavg LoRA, window|{s}"] = {"correct": ref, "groups": list(range(n)),
                                                "theta_bytes": 1000}
        lines = accuracy_table(cfg, {"runs": runs}).splitlines()
        assert "| 28.6 (best baseline) |" in next(x for x in lines if x.startswith("| fedala |"))
        row = next(line for line in lines if line.startswith("| fednl |"))
        return row

    steady = table([20, 21, 19])       # +10 points in every seed
    assert "| 10.0 [5.8, 14.3] (seeds [8.8, 11.2]) | better | - | 1.0 | 29.7 |" in steady
    lucky = table([60, 0, 0])          # +10 points on average, all of it from one seed
    pooled_low = float(lucky.split("| 10.0 [")[1].split(",")[0])
    assert pooled_low > 0               # the items alone would call it better
    assert "| no difference |" in lucky and "(seeds [-" in lucky


def test_central_yardstick_trains_on_every_clients_data_for_the_federations_steps(
        quick_experiment, monkeypatch):
    """The central pooled row trains theta once, without Flower, on all seven NIAH clients'
    items for rounds x local steps x clients optimiser steps; its theta is saved and a second
    call loads it."""
    import plasticlm.experiments.fednl.central_yardstick as central
    from plasticlm.experiments.fednl.variants import federated_config, trained_model, variants
    from plasticlm.fednl.build import tasks_for
    from plasticlm.fednl.theta import get_theta

    cfg = quick_experiment("niah", "run.train.rounds=2", "run.train.local_steps=3")
    row = next(v for v in variants(cfg) if v.central)
    fcfg = federated_config(cfg, row, 0, Path(cfg.out) / "niah")
    seen = {}
    real = central.local_update

    def spy(model, tok, task, theta, state, c, seed):
        seen.update(items={id(x) for x in task.train}, steps=c.train.local_steps)
        return real(model, tok, task, theta, state, c, seed)

    monkeypatch.setattr(central, "local_update", spy)
    monkeypatch.setattr("plasticlm.experiments.fednl.variants.run_federated",
                        lambda c: pytest.fail("the central row ran a federation"))
    model, tok, summary = trained_model(fcfg, True, progress=False, central=True)
    clients = tasks_for(fcfg)
    assert len(clients) == 7
    assert seen["items"] == {id(x) for t in clients for x in t.train}
    assert seen["steps"] == summary["central_steps"] == 2 * 3 * 7
    theta = get_theta(model)
    untrained = get_theta(trained_model(fcfg, False, progress=False)[0])
    assert any(not torch.equal(theta[k], untrained[k]) for k in theta)
    # trained once: the second call loads the saved theta
    monkeypatch.setattr(central, "local_update", lambda *a: pytest.fail("trained again"))
    again = get_theta(trained_model(fcfg, True, progress=False, central=True)[0])
    assert all(torch.equal(theta[k], again[k]) for k in theta)


def test_baseline_gap_line_gives_fednl_minus_each_paper_baseline():
    from plasticlm.experiments.fednl.experiment import accuracy_table
    from plasticlm.experiments.fednl.variants import ExperimentConfig

    cfg = ExperimentConfig(experiment="niah", seeds=3, rows=("fednl", "fedala", "fedprox"))
    n = 200

    def run(right):
        return {"correct": [1.0 if i < right else 0.0 for i in range(n)],
                "groups": list(range(n)), "theta_bytes": 1000}

    runs = {}
    for s in range(3):
        runs[f"fednl|{s}"] = run(80 + s)
        runs[f"fedala|{s}"] = run(60)          # FedNL +10 points in every seed
        runs[f"fedprox|{s}"] = run(80 + s)     # the same answers as FedNL
        runs[f"fedavg LoRA, window|{s}"] = run(50)
    lines = accuracy_table(cfg, {"runs": runs}).splitlines()
    gaps = next(x for x in lines if x.startswith("FedNL minus each of the paper's baselines"))
    prox, ala = gaps.split(": ", 1)[1].split("; ")
    assert prox.startswith("fedprox 0.0 [") and prox.endswith("no difference")
    assert ala.startswith("fedala 10.5 [") and ala.endswith("better.")
    no_baseline = ExperimentConfig(experiment="niah", seeds=3, rows=("fednl",))
    assert "FedNL minus each" not in accuracy_table(no_baseline, {"runs": runs})


def test_lever_line_gives_each_fednl_variant_minus_fednl():
    """What each lever moved: the row minus FedNL at the same budget, paired on the items;
    the central yardstick and the untrained control are not levers."""
    from plasticlm.experiments.fednl.experiment import accuracy_table
    from plasticlm.experiments.fednl.variants import ExperimentConfig

    cfg = ExperimentConfig(experiment="niah", seeds=3,
                           rows=("fednl", "fednl, 3x rounds", "fednl, FedAvgM",
                                 "fednl, central (pooled)", "fednl, untrained memory"))
    n = 200

    def run(right):
        return {"correct": [1.0 if i < right else 0.0 for i in range(n)],
                "groups": list(range(n)), "theta_bytes": 1000, "central_steps": 252}

    runs = {}
    for s in range(3):
        runs[f"fednl|{s}"] = run(60 + s)
        runs[f"fednl, 3x rounds|{s}"] = run(80 + s)     # +10 points in every seed
        runs[f"fednl, FedAvgM|{s}"] = run(60 + s)       # the same answers
        runs[f"fednl, central (pooled)|{s}"] = run(90)
        runs[f"fednl, untrained memory|{s}"] = run(50)
        runs[f"fedavg LoRA, window|{s}"] = run(50)
    lines = accuracy_table(cfg, {"runs": runs}).splitlines()
    line = next(x for x in lines if x.startswith("Each FedNL variant minus 'fednl'"))
    rounds, avgm = line.split(": ", 1)[1].split("; ")
    assert rounds.startswith("fednl, 3x rounds 10.0 [") and rounds.endswith("better")
    assert avgm.startswith("fednl, FedAvgM 0.0 [") and avgm.endswith("no difference.")
    assert "central" not in line and "untrained" not in line
    alone = ExperimentConfig(experiment="niah", seeds=3, rows=("fednl",))
    assert "Each FedNL variant" not in accuracy_table(alone, {"runs": runs})


def test_central_gap_line_pairs_each_federated_fednl_row_with_the_yardstick():
    from plasticlm.experiments.fednl.experiment import accuracy_table
    from plasticlm.experiments.fednl.variants import ExperimentConfig

    cfg = ExperimentConfig(experiment="niah", seeds=3,
                           rows=("fednl", "fednl, central (pooled)", "fednl, 3x rounds"))
    n = 200

    def run(right, **extra):
        return {"correct": [1.0 if i < right else 0.0 for i in range(n)],
                "groups": list(range(n)), "theta_bytes": 1000, **extra}

    runs = {}
    for s in range(3):
        runs[f"fednl|{s}"] = run(60 + s, drop=0.01)
        runs[f"fednl, 3x rounds|{s}"] = run(100 + s, drop=0.01)
        runs[f"fednl, central (pooled)|{s}"] = run(100 - s, central_steps=252)
        runs[f"fedavg LoRA, window|{s}"] = run(50, drop=0.0)
    table = accuracy_table(cfg, {"runs": runs})
    gaps = next(line for line in table.splitlines() if line.startswith("Federated minus"))
    assert "(252 steps" in gaps
    assert "fednl -19.0 [" in gaps and "fednl -19.0" in gaps.split(";")[0]
    assert "worse" in gaps.split(";")[0]
    assert "fednl, 3x rounds 1.0 [" in gaps.split(";")[1]
    assert "central (pooled) -" not in gaps   # the yardstick is not compared with itself
    central_row = next(line for line in table.splitlines()
                       if line.startswith("| fednl, central (pooled) |"))
    assert "| - |" in central_row            # no aggregation drop: nothing was averaged
