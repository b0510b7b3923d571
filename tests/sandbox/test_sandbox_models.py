"""Sandbox pre-training (quick preset, seconds), text pre-training, and the data CLI."""

import argparse
import json
import os
import shutil

import pytest

from plasticlm.cli import data as data_cli
from plasticlm.cli import pretrain_cmd
from plasticlm.data import load_mmlu, write_text_corpus
from plasticlm.errors import PlasticError
from plasticlm.eval import MCConfig, evaluate_mc_items
from plasticlm.sandbox import (
    PRESETS,
    TextPretrainConfig,
    ensure_sandbox_models,
    niah_drill_batch,
    preset_dir,
    pretrain_preset,
    pretrain_text,
    reading_drill_batch,
    sandbox_model,
    train_drills,
    world_mc_items,
)

TINY_TEXT = TextPretrainConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2,
                               num_kv_heads=1, head_dim=16, intermediate_size=64, steps=2,
                               batch_size=2, seq_len=32)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("sandbox-quick")
    return out, pretrain_preset("quick", out, progress=False)


def test_quick_preset_writes_loadable_family(quick):
    from plasticlm.models import load_causal_lm

    out, report = quick
    archs, vocabs = set(), set()
    for spec in PRESETS["quick"].models:
        model, tok = load_causal_lm(out / spec.name)
        archs.add(model.config.model_type)
        vocabs.add(len(tok))
        assert model.config.vocab_size == len(tok)
        entry = report["models"][spec.name]
        assert entry["mc_core_heldout"]["all"]["n"] > 0
        core = entry["mc_core_heldout"]["all"]
        assert core["low"] <= core["accuracy"] <= core["high"]
        assert {"split/dev", "split/val", "split/test"} <= set(entry["mc_specialist"])
        assert {"valid_loss", "unigram_loss", "train_seconds", "train_cpu_seconds"} <= set(entry)
    assert archs == {"qwen3", "llama"} and len(vocabs) == 2
    assert "single/160" in report["models"]["receiver"]["niah"]
    openbook = report["models"]["receiver"]["openbook"]
    assert openbook["all"]["n"] == 8 and openbook["all"]["low"] <= openbook["all"]["high"]
    before = report["models"]["receiver"]["before_drills"]
    assert "single/160" in before["niah"] and before["mc_core_heldout"]["n"] > 0
    assert json.loads((out / "report.json").read_text())["preset"] == "quick"
    assert (out / "world" / "world.json").exists()
    assert (out / "world" / "openbook" / "items.jsonl").exists()
    assert (out / "world" / "client_streams.jsonl").exists()
    assert "specialist test" in (out / "probes.md").read_text()
    assert not list(out.glob("*.ckpt")), "a finished preset leaves no checkpoint"


def test_mc_accuracy_matches_unbatched_reference(quick):
    """Batched scoring picks the same choices as a plain one-sequence-at-a-time log-prob."""
    import torch

    from plasticlm.models import load_causal_lm
    from plasticlm.sandbox.passages import mc_prompt

    out, _ = quick
    model, tok = load_causal_lm(out / "receiver")
    qs = load_mmlu(out / "world" / "mmlu", "test")[:8]
    reference = []
    for q in qs:
        prompt = [tok.bos_token_id, *tok(mc_prompt(q.question), add_special_tokens=False)
                  ["input_ids"]]
        scores = []
        for c in q.choices:
            cont = tok(" " + c, add_special_tokens=False)["input_ids"]
            ids = torch.tensor([prompt + cont])
            with torch.no_grad():
                logp = model(ids).logits[0, :-1].log_softmax(-1)
            scores.append(sum(logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(cont)))
        reference.append(max(range(4), key=scores.__getitem__) == q.answer_index)
    batched = evaluate_mc_items(model, tok, qs, MCConfig(method="continuation", batch_size=32))
    assert batched.correct == reference


def test_world_mc_items_are_the_records_behind_the_accuracy_table(quick):
    from plasticlm.models import load_causal_lm

    out, report = quick
    model, tok = load_causal_lm(out / "receiver")
    items = world_mc_items(model, tok, out / "world")
    table = report["models"]["receiver"]["mc_core_heldout"]
    assert len(items) == table["all"]["n"]
    assert sum(it["correct"] for it in items) / len(items) == pytest.approx(
        table["all"]["accuracy"], abs=1e-4)
    for split in ("val", "test"):
        mine = [it["correct"] for it in items if it["split"] == split]
        assert len(mine) == table[f"split/{split}"]["n"]


def test_niah_drill_batch_labels_only_the_answer(quick):
    from plasticlm.data.corpus import load_text_corpus
    from plasticlm.data.niah import generate_niah, haystack_sentences
    from plasticlm.models import load_causal_lm

    out, _ = quick
    _, tok = load_causal_lm(out / "receiver")
    hay = haystack_sentences(load_text_corpus(out / "world" / "corpus" / "train.txt"))
    ids, labels = niah_drill_batch(tok, hay, 3, 60, seed=5)
    assert ids.shape == labels.shape and ids.shape[0] == 3
    samples = generate_niah("single", 3, 60, hay, seed=5)
    for row_ids, row_labels, s in zip(ids, labels, samples):
        answer = row_ids[row_labels != -100].tolist()
        assert tok.decode(answer).strip() == s.target.strip()
    other, _ = niah_drill_batch(tok, hay, 3, 60, seed=6)
    assert not (other.shape == ids.shape and bool((other == ids).all()))


def test_reading_drills_ask_about_a_fresh_entity_of_their_own_passage(quick):
    """The answer is the value the drill's passage states (before the filler), for an entity
    no world entity is called, and it changes with the seed: only reading can answer."""
    from plasticlm.models import load_causal_lm
    from plasticlm.sandbox.world import generate_world

    out, _ = quick
    _, tok = load_causal_lm(out / "receiver")
    world = generate_world(PRESETS["quick"].world)
    names = {e.name for e in world.entities}
    ids, labels = reading_drill_batch(world, tok, 6, (5, 10), seed=3)
    answers = set()
    for row_ids, row_labels in zip(ids, labels):
        text = tok.decode(row_ids[row_labels == -100][1:], skip_special_tokens=True)
        answer = tok.decode(row_ids[row_labels != -100]).strip()
        passage, question = text.split("\n")[0], text.split("\n")[-1]
        assert answer and answer in passage
        assert question.startswith("Q: ") and question.rstrip().endswith("A:")
        assert not any(n in question for n in names)
        answers.add(answer)
    assert len(answers) > 1
    other, _ = reading_drill_batch(world, tok, 6, (5, 10), seed=4)
    assert not (other.shape == ids.shape and bool((other == ids).all()))


def test_drills_lower_the_drill_loss(quick):
    """Drills train: the loss of the last steps is below that of the first."""
    from plasticlm.data.corpus import load_text_corpus
    from plasticlm.data.niah import haystack_sentences
    from plasticlm.models import build_tiny, load_causal_lm
    from plasticlm.sandbox.world import generate_world

    out, _ = quick
    _, tok = load_causal_lm(out / "receiver")
    hay = haystack_sentences(load_text_corpus(out / "world" / "corpus" / "train.txt"))
    model = build_tiny("qwen3", vocab_size=len(tok), hidden_size=32, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64)
    world = generate_world(PRESETS["quick"].world)
    losses = train_drills(model, tok, hay, 30, lengths=(48,), batch_size=4, lr=3e-3,
                          world=world, reading_share=0.5, reading_filler=(0, 5),
                          progress=False)
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5


def test_ensure_reuses_trained_models(quick, monkeypatch):
    out, _ = quick
    root = preset_dir("quick")
    shutil.copytree(out, root, dirs_exist_ok=True)
    stamp = os.path.getmtime(root / "receiver" / "config.json")
    paths = ensure_sandbox_models("quick", progress=False)
    assert paths["receiver"] == root / "receiver"
    assert os.path.getmtime(root / "receiver" / "config.json") == stamp
    assert sandbox_model("specialist", "quick") == root / "specialist"
    with pytest.raises(PlasticError, match="no sandbox model 'nope'"):
        sandbox_model("nope", "quick")
    with pytest.raises(PlasticError, match="unknown pretrain preset"):
        ensure_sandbox_models("huge")


def test_ensure_retrains_a_model_trained_under_another_preset_definition(quick):
    """A cached model whose key no longer matches the preset (an older world or spec) is
    trained again, and only it: the others are loaded as they are."""
    out, _ = quick
    root = preset_dir("quick")
    shutil.copytree(out, root, dirs_exist_ok=True)
    info_path = root / "specialist" / "pretrain_info.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "key": "an older preset"}))
    receiver = os.path.getmtime(root / "receiver" / "config.json")
    specialist = os.path.getmtime(root / "specialist" / "config.json")
    ensure_sandbox_models("quick", progress=False)
    assert json.loads(info_path.read_text())["key"] == info["key"]
    assert os.path.getmtime(root / "specialist" / "config.json") > specialist
    assert os.path.getmtime(root / "receiver" / "config.json") == receiver


def test_pretrain_text(tmp_path):
    from plasticlm.models import load_causal_lm

    text = write_text_corpus(tmp_path / "t.txt", [f"Story {i}: the cat sat on mat {i % 7}."
                                                  for i in range(60)])
    report = pretrain_text(text, tmp_path / "m", TINY_TEXT, progress=False)
    model, tok = load_causal_lm(tmp_path / "m")
    assert model.config.model_type == "qwen3" and len(tok) == model.config.vocab_size
    assert report["valid_loss"] > 0 and report["unigram_loss"] > 0
    (tmp_path / "one.txt").write_text("only one story")
    with pytest.raises(PlasticError, match="at least 2 documents"):
        pretrain_text(tmp_path / "one.txt", tmp_path / "m2", TINY_TEXT, progress=False)


def _cli(argv) -> int:
    parser = argparse.ArgumentParser(prog="plasticlm")
    sub = parser.add_subparsers(dest="command", required=True)
    data_cli.register(sub)
    models = sub.add_parser("models").add_subparsers(dest="models_command", required=True)
    pretrain_cmd.add_pretrain_parser(models)
    args = parser.parse_args(argv)
    return args.func(args)


def test_data_cli(tmp_path, capsys):
    out = tmp_path / "w"
    assert _cli(["data", "world", "--seed", "2", "--out", str(out), "--set",
                 "core_per_domain=8", "--set", "drills=2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["entities"]["core"] == 40 and summary["mmlu"]["test"]["subjects"] == 5
    assert _cli(["data", "niah", "--task", "multivalue", "--length", "300", "--n", "3",
                 "--haystack", str(out), "--out", str(tmp_path / "n.jsonl")]) == 0
    capsys.readouterr()
    assert _cli(["data", "inspect", str(tmp_path / "n.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"] == {"multivalue": 3}
    (tmp_path / "x.bin").write_bytes(b"\0")
    with pytest.raises(PlasticError, match="unknown data format"):
        _cli(["data", "inspect", str(tmp_path / "x.bin")])


def test_pretrain_cli_errors(tmp_path):
    with pytest.raises(PlasticError, match="exactly one of"):
        _cli(["models", "pretrain"])
    with pytest.raises(PlasticError, match="needs --out"):
        _cli(["models", "pretrain", "--text", "x.txt"])


def test_killed_preset_resumes_where_it_stopped(tmp_path, monkeypatch):
    """A preset stopped in the receiver's drills keeps its pre-trained stage: the re-run
    trains only the models that were not finished and finishes the drills."""
    import plasticlm.sandbox.drills as drills
    import plasticlm.sandbox.pretrain as pretrain

    real_batch, calls = drills.niah_drill_batch, []

    def dying_batch(*args, **kwargs):
        calls.append(kwargs.get("seed"))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_batch(*args, **kwargs)

    monkeypatch.setattr(drills, "niah_drill_batch", dying_batch)
    with pytest.raises(KeyboardInterrupt):
        pretrain_preset("quick", tmp_path, progress=False)
    assert (tmp_path / "receiver.ckpt" / "pretrained" / "config.json").exists()
    assert (tmp_path / "receiver.ckpt" / "drills" / "meta.json").exists()
    monkeypatch.setattr(drills, "niah_drill_batch", real_batch)
    trained = []
    real_train_lm = pretrain.train_lm
    monkeypatch.setattr(pretrain, "train_lm",
                        lambda model, *a, **k: trained.append(k["desc"]) or real_train_lm(model, *a, **k))
    report = pretrain_preset("quick", tmp_path, progress=False)
    assert "pre-train receiver" not in trained
    assert trained == ["pre-train transmitter-llama", "pre-train specialist"]
    assert report["models"]["receiver"]["drill_loss_every_10"]
    assert not (tmp_path / "receiver.ckpt").exists()
