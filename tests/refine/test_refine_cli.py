"""``plasticlm refine``: argument parsing, ``ask`` on saved models and fusers, errors."""

import argparse
import json

import pytest
import torch

from plasticlm.cli import refine as refine_cli
from plasticlm.errors import PlasticError
from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.refine import Fuser, kv_layout

# Tiny models on a shared CPU: one intra-op thread is much faster than two.
pytestmark = pytest.mark.usefixtures("one_thread")


def _parser():
    parser = argparse.ArgumentParser(prog="plasticlm")
    refine_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("refine_cli")
    texts = ["Q: Which organ does Kalomira act on? A: liver.", "Doctors prescribe Zutorex."] * 8
    out = {}
    for name, arch, vocab, layers in (("r", "qwen3", 280, 3), ("t", "llama", 260, 2)):
        tok = train_bpe_tokenizer(texts, vocab_size=vocab)
        model = build_tiny(arch, seed=len(name), vocab_size=len(tok), hidden_size=32,
                           num_layers=layers, num_heads=2, num_kv_heads=1, head_dim=16,
                           intermediate_size=64)
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        out[name] = (root / name, model)
    fuser = Fuser.for_pair(kv_layout(out["r"][1]), kv_layout(out["t"][1]), rank=4)
    with torch.no_grad():  # random output maps and open gates: the fuser changes answers
        for layer in fuser.layers:
            for path in (layer.key_path, layer.value_path):
                path.out.weight.normal_(0, 0.5)
            layer.gate_logits.fill_(2.0)
    fuser.save_pretrained(root / "fuser")
    return {"r": str(out["r"][0]), "t": str(out["t"][0]), "fuser": str(root / "fuser")}


def test_ask_scores_choices_in_alone_and_c2c(folders, capsys):
    base = ["refine", "ask", "Q: Which organ does Kalomira act on? A:", "--receiver",
            folders["r"], "--choices", "liver|heart|lung|skin"]
    results = {}
    for mode in ("alone", "c2c"):
        args = _parser().parse_args(base + ["--transmitter", folders["t"], "--fuser",
                                            folders["fuser"], "--mode", mode])
        assert args.func(args) == 0
        results[mode] = json.loads(capsys.readouterr().out)
    assert results["alone"]["wire_bytes"] == 0 < results["c2c"]["wire_bytes"]
    assert results["alone"]["scores"] != results["c2c"]["scores"]
    assert results["c2c"]["choice"] in ("liver", "heart", "lung", "skin")


def test_ask_generates_and_rejects_mismatched_fusers(folders, capsys):
    args = _parser().parse_args(["refine", "ask", "Q: Which organ", "--receiver", folders["r"],
                                 "--mode", "alone", "--max-new-tokens", "3"])
    assert args.func(args) == 0
    assert "answer" in json.loads(capsys.readouterr().out)
    args = _parser().parse_args(["refine", "ask", "Q:", "--receiver", folders["r"],
                                 "--transmitter", folders["t"]])
    with pytest.raises(PlasticError, match="one fuser folder per transmitter"):
        args.func(args)


def test_experiment_and_train_parse_overrides():
    args = _parser().parse_args(["refine", "experiment", "--set", "fuser.epochs=2", "--set",
                                 "max_eval=4"])
    assert args.overrides == ["fuser.epochs=2", "max_eval=4"] and args.which == "modes"
    args = _parser().parse_args(["refine", "experiment", "transfer", "--quick"])
    assert args.which == "transfer" and args.quick_preset == "refine/transfer-quick"
    args = _parser().parse_args(["refine", "train-fuser", "--receiver", "sandbox:receiver",
                                 "--transmitter", "sandbox:specialist", "--out", "f",
                                 "--set", "rank=8"])
    assert args.overrides == ["rank=8"] and args.splits == "dev,val"
    with pytest.raises(SystemExit):       # one grammar: a bare key=value is not an override
        _parser().parse_args(["refine", "experiment", "fuser.epochs=2"])


def test_link_latency_model_by_hand():
    from plasticlm.refine.report import crossover_mb_per_s, link_latency_ms

    # 10 ms of compute, 20 ms round trip, 16 KB at 1 MB/s = 16 ms
    assert link_latency_ms(10.0, 16_000, 1.0, rtt_ms=20.0) == pytest.approx(46.0)
    assert link_latency_ms(10.0, 0, 1.0) == 10.0             # nothing sent, no round trip
    c2c = {"latency_ms": 10.0, "wire_bytes": 16_000}
    t2t = {"latency_ms": 22.0, "wire_bytes": 100}
    # extra 15,900 bytes cost less than the 12 ms saved above 15,900 / 12 ms = 1.325 MB/s
    assert crossover_mb_per_s(c2c, t2t) == pytest.approx(1.325)
    assert crossover_mb_per_s(t2t, c2c) is None


def test_pretrain_fuser_into_a_registry_then_answer_through_it(tmp_path, capsys):
    from plasticlm.cli import main
    from plasticlm.refine.wire.fuser_registry import registered_pairs

    registry = tmp_path / "fusers"
    assert main(["refine", "pretrain-fuser", "--receiver", "quick:receiver", "--transmitter",
                 "quick:specialist", "--registry", str(registry), "--examples", "8",
                 "--set", "epochs=1", "--set", "hidden=16", "--set", "batch_size=4"]) == 0
    assert registered_pairs(registry) == [("specialist", "receiver")]
    summary = json.loads((registry / "specialist--to--receiver" / "train_summary.json")
                         .read_text())
    assert summary["examples"] == 8 and summary["steps"] == 2
    assert "world/corpus/train.txt" in summary["corpus"]      # general text, no task fact
    capsys.readouterr()
    assert main(["refine", "ask", "Q: Which organ does Ofloxin act on? A:", "--receiver",
                 "quick:receiver", "--transmitter", "quick:specialist", "--registry",
                 str(registry), "--choices", "liver|heart"]) == 0
    assert json.loads(capsys.readouterr().out)["choice"] in ("liver", "heart")
    # a pair that is not registered names what is there
    assert main(["refine", "ask", "Q: x A:", "--receiver", "quick:specialist", "--transmitter",
                 "quick:receiver", "--registry", str(registry)]) == 2
    assert "registered: specialist -> receiver" in capsys.readouterr().err


def test_transfer_results_give_each_difference_its_interval_over_seeds():
    """Every paired difference of the transfer table carries the t-interval of the seeds'
    differences; a control with one deterministic seed pairs with every seed."""
    from plasticlm.eval import paired_seed_ci
    from plasticlm.refine.report import transfer_results, transfer_table

    alone = [[0.0, 1.0, 0.0, 1.0]]
    fused = [[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]]
    control = [[0.0, 1.0, 0.0, 1.0]]
    scores = {"alone": alone, "c2c, specialist": fused, "c2c, control": control}
    results = transfer_results(scores, {}, ["a", "b", "c", "d"])
    row = results["c2c, specialist"]
    over = row["minus_control_over_seeds"]
    want = paired_seed_ci(fused, control * 3)   # seed differences 0.25, 0.5, 0.0
    assert (over["mean"], over["low"], over["high"]) == (want.mean, want.low, want.high)
    assert over["low"] < 0 < over["high"]   # three seeds that disagree establish nothing
    assert "minus_alone_over_seeds" in row
    table = transfer_table({"probe_gate": {"rows": []}, "results": results, "n_eval": 4,
                            "test_entities": 4})
    assert "25.0 [" in table and "(seeds [" in table


def test_ask_names_the_peers_that_could_not_be_reached(tmp_path, capsys):
    """A cache mode whose every --peer is down is refused naming each of them, not as if no
    transmitter had been given."""
    from plasticlm.cli import main

    (tmp_path / "fusers").mkdir()
    assert main(["refine", "ask", "Q: Which organ does Ofloxin act on? A:", "--receiver",
                 "quick:receiver", "--peer", "http://127.0.0.1:9", "--registry",
                 str(tmp_path / "fusers"), "--mode", "c2c", "--timeout", "2"]) == 2
    err = capsys.readouterr().err
    assert "none given could be reached: http://127.0.0.1:9" in err and "none given)" not in err
