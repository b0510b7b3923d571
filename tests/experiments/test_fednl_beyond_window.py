"""The beyond-the-window comparison (plasticlm.experiments.fednl.beyond_window) on the quick sandbox:
the report's shape, NIAH items whose needle lies beyond the window, and which variant
trains what."""

from __future__ import annotations

import pytest
import torch

from plasticlm.experiments.fednl import beyond_window as bw

WINDOW = 16
LENGTH = 128   # the quick tokenizer needs 128 tokens to leave a haystack
VARIANTS = ("window, untrained", "window + LoRA", "memory (FedNL theta)")


@pytest.fixture(scope="module")
def quick():
    from plasticlm.models import load_causal_lm
    from plasticlm.sandbox import get_preset, sandbox_model
    from plasticlm.sandbox.world import generate_world

    folder = sandbox_model("receiver", preset="quick")
    return folder, generate_world(get_preset("quick").world), load_causal_lm(folder)[1]


@pytest.fixture(scope="module")
def run(quick):
    """One small run; every model ``build`` makes is kept with its parameters at build."""
    folder, world, _ = quick
    built, real_build = [], bw.build

    def spy(variant, *args, **kwargs):
        model, tok = real_build(variant, *args, **kwargs)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        built.append((variant, model, before, trainable))
        return model, tok

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bw, "build", spy)
        report = bw.run_beyond_window(folder, world, "niah", VARIANTS, window=WINDOW, steps=3,
                                      batch=2, seeds=2, max_test=6, niah_length=LENGTH,
                                      progress=False)
    return report, built


def _changed(model, before, names) -> set[str]:
    now = dict(model.named_parameters())
    return {n for n in names if not torch.equal(now[n].detach(), before[n])}


def test_the_report_has_every_variant_with_an_accuracy_and_intervals(run):
    report, _ = run
    assert list(report["table"]) == list(VARIANTS)
    assert (report["seeds"], report["test_items"], report["window"]) == (2, 6, WINDOW)
    for v, row in report["table"].items():
        assert 0 <= row["low"] <= row["accuracy"] <= row["high"] <= 1, v
        assert row["diff_low"] <= row["minus_window_lora"] <= row["diff_high"], v
        assert row["diff_seeds_low"] <= row["minus_window_lora"] <= row["diff_seeds_high"], v
        assert [len(s) for s in row["correct_per_seed"]] == [6, 6], v
        assert len(row["seconds"]) == 2, v
    base = report["table"]["window + LoRA"]["correct_per_seed"]
    for v, row in report["table"].items():   # each difference is against window + LoRA
        mine = row["correct_per_seed"]
        mean = sum(map(sum, mine)) / 12
        assert row["accuracy"] == pytest.approx(mean), v
        assert row["minus_window_lora"] == pytest.approx(mean - sum(map(sum, base)) / 12), v
    table = bw.beyond_window_table(report).splitlines()
    assert len(table) == 2 + len(VARIANTS)
    assert all(any(line.startswith(f"| {v} |") for line in table) for v in VARIANTS)


def test_every_difference_is_paired_against_window_lora(quick, monkeypatch):
    """Stub models scoring by design: the untrained window none right, window + LoRA every
    other item, the memory all; the differences must be -0.5, 0 and +0.5."""
    import plasticlm.eval
    from plasticlm.eval import ClosedSetResult

    folder, world, _ = quick
    right = {"window, untrained": lambda i: 0.0, "window + LoRA": lambda i: float(i % 2),
             "memory (FedNL theta)": lambda i: 1.0}

    class Stub:
        def __init__(self, variant):
            self.variant = variant

    def score(model, tok, prompts, choices, answers, batch_size=16):
        correct = tuple(right[model.variant](i) for i in range(len(prompts)))
        return ClosedSetResult(tuple(answers), correct, (0.25,) * len(prompts))

    monkeypatch.setattr(bw, "build", lambda variant, *a: (Stub(variant), None))
    monkeypatch.setattr(bw, "train", lambda *a: [1.0])
    monkeypatch.setattr(plasticlm.eval, "closed_set_accuracy", score)
    report = bw.run_beyond_window(folder, world, "niah", VARIANTS, seeds=2, max_test=6,
                                  niah_length=LENGTH, progress=False)
    diffs = {v: row["minus_window_lora"] for v, row in report["table"].items()}
    assert diffs == pytest.approx({VARIANTS[0]: -0.5, VARIANTS[1]: 0.0, VARIANTS[2]: 0.5})
    memory = report["table"][VARIANTS[2]]
    assert memory["accuracy"] == 1.0 and memory["diff_low"] > 0 and memory["final_loss"] == [
        1.0, 1.0]


def test_niah_items_put_the_needle_among_four_choices_beyond_the_window(quick):
    from plasticlm.data.niah import generate_niah, haystack_sentences

    _, world, tok = quick
    items = bw.niah_items(world, tok, LENGTH, 12, seed=2)
    needles = generate_niah("single", 12, LENGTH, haystack_sentences(world.valid_docs), seed=2,
                            tokenizer=tok, depths=(0.0, 0.2, 0.4))
    assert len(items) == 12
    for item, sample in zip(items, needles):
        assert len(item.choices) == 4 and len(set(item.choices)) == 4
        assert item.choices[item.answer] == sample.answers[0]
        ids = tok(item.prompt, add_special_tokens=False)["input_ids"]
        assert item.choices[item.answer] in tok.decode(ids[:-WINDOW])     # before the window
        assert item.choices[item.answer] not in tok.decode(ids[-WINDOW:])  # not inside it
    assert len({it.answer for it in items}) > 1   # the right answer's place varies


def test_the_untrained_window_is_not_trained(run):
    from plasticlm.memory import memory_config

    report, built = run
    untrained = [b for b in built if b[0] == "window, untrained"]
    assert len(untrained) == 2
    for _, model, before, _ in untrained:
        assert memory_config(model).layers == () and memory_config(model).window == WINDOW
        assert _changed(model, before, before) == set()
    assert report["table"]["window, untrained"]["final_loss"] == [None, None]


def test_the_memory_trains_only_theta(run):
    from plasticlm.memory import memory_config, meta_parameters

    _, built = run
    memory = [b for b in built if b[0] == "memory (FedNL theta)"]
    assert len(memory) == 2
    for _, model, before, trainable in memory:
        n_layers = model.config.num_hidden_layers
        assert memory_config(model).layers == tuple(range(n_layers))
        theta = {id(p) for p in meta_parameters(model).values()}
        named = dict(model.named_parameters())
        assert {id(named[n]) for n in trainable} == theta   # only theta may train
        assert _changed(model, before, set(named) - trainable) == set()   # base untouched
        assert _changed(model, before, trainable)   # some of theta moved
