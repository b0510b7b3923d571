"""The shipped taught oracle: taken instead of teaching only when it was taught with the same
facts and drill settings from the same base weights, every file checked against its SHA-256
manifest first; the package's copy matches its manifest and the shipped receiver."""

import dataclasses
import json

import pytest
import torch

import plasticlm.experiments.refine.shipped_taught as shipped_module
import plasticlm.experiments.refine.taught as taught_module
from plasticlm.errors import PlasticError
from plasticlm.experiments.refine.ladder import Ladder, TransferConfig
from plasticlm.experiments.refine.rungs import LadderConfig
from plasticlm.experiments.refine.shipped_taught import (
    SHIPPED_TAUGHT,
    shipped_taught,
    weights_sha256,
    write_shipped_taught,
)
from plasticlm.experiments.refine.taught import Facts, taught_peer, teaching_key
from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.sandbox.pretrain import save_model_atomic
from plasticlm.sandbox.shipped import mismatches, read_manifest, shipped_dir

FACTS = [(f"Q: Where does {n} live? A:", f" {c}") for n, c in
         [("Kalo", "Rome"), ("Mizu", "Oslo"), ("Tor", "Lima"), ("Vex", "Bern")]]
CORPUS = ["Kalo lives in Rome. Mizu lives in Oslo.", "Tor lives in Lima. Vex lives in Bern."] * 8

pytestmark = pytest.mark.usefixtures("one_thread")


def _base(folder, seed=0):
    tok = train_bpe_tokenizer([q + a for q, a in FACTS] + CORPUS, vocab_size=300)
    model = build_tiny("qwen3", seed=seed, vocab_size=len(tok), hidden_size=32, num_layers=2,
                       num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64)
    save_model_atomic(model, tok, folder)
    return str(folder)


def test_a_shipped_taught_model_is_taken_only_for_its_facts_and_base_weights(tmp_path,
                                                                            monkeypatch):
    base = _base(tmp_path / "base")
    here = LadderConfig(teach_steps=3, teach_replay=0, progress=False, shipped_taught=False)
    taught = taught_peer(tmp_path / "a", base, "oracle", FACTS, here, CORPUS)
    root = tmp_path / "shipped"
    write_shipped_taught(tmp_path / "a" / "taught" / "oracle", weights_sha256(tmp_path / "base"),
                         "test", root=root)
    monkeypatch.setattr(shipped_module, "SHIPPED_TAUGHT", root)
    drills = []
    teach = taught_module.teach_facts
    monkeypatch.setattr(taught_module, "teach_facts",
                        lambda *a, **k: drills.append(1) or teach(*a, **k))
    shipped = dataclasses.replace(here, shipped_taught=True)

    peer = taught_peer(tmp_path / "b", base, "oracle", FACTS, shipped, CORPUS)
    assert drills == []                                     # the shipped copy, no drills
    for a, b in zip(peer.model.state_dict().values(), taught.model.state_dict().values()):
        assert torch.equal(a.float(), b.float())
    assert json.loads((tmp_path / "b/taught/oracle/taught.json").read_text())["shipped"]
    taught_peer(tmp_path / "b", base, "oracle", FACTS, shipped, CORPUS)   # kept in the run
    assert drills == []
    taught_peer(tmp_path / "c", base, "oracle", FACTS[:2], shipped, CORPUS)   # other facts
    assert drills == [1]
    taught_peer(tmp_path / "d", base, "oracle", FACTS, here, CORPUS)          # asked to teach
    assert drills == [1, 1]
    # asked to teach where the run holds the shipped copy: taught, over the copy
    taught_peer(tmp_path / "b", base, "oracle", FACTS, here, CORPUS)
    assert drills == [1, 1, 1]
    assert "shipped" not in json.loads((tmp_path / "b/taught/oracle/taught.json").read_text())
    taught_peer(tmp_path / "b", base, "oracle", FACTS[:2], shipped, CORPUS)   # a new key, again
    assert drills == [1, 1, 1, 1]
    _base(tmp_path / "base", seed=1)             # the same spec, other weights: taught again
    taught_peer(tmp_path / "e", base, "oracle", FACTS, shipped, CORPUS)
    assert drills == [1, 1, 1, 1, 1]


def test_a_shipped_file_that_differs_from_its_hash_is_refused(tmp_path):
    src = tmp_path / "run" / "oracle"
    src.mkdir(parents=True)
    (src / "taught.json").write_text(json.dumps({"key": "k"}))
    (src / "model.safetensors").write_bytes(b"weights!")
    base, other = tmp_path / "base", tmp_path / "other"
    for folder, weights in ((base, b"base"), (other, b"other")):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(weights)
    root = tmp_path / "shipped"
    folder = write_shipped_taught(src, weights_sha256(base), "test", root=root)
    assert shipped_taught("oracle", "k", base, root) == folder
    assert shipped_taught("oracle", "other key", base, root) is None
    assert shipped_taught("oracle", "k", other, root) is None
    assert shipped_taught("no such model", "k", base, root) is None
    (folder / "model.safetensors").write_bytes(b"weights?")           # same size, other bytes
    with pytest.raises(PlasticError, match="does not match its manifest"):
        shipped_taught("oracle", "k", base, root)
    manifest = json.loads((folder / "manifest.json").read_text())
    for broken in ({**manifest, "files": {"../escape": manifest["files"]["taught.json"]}},
                   {k: v for k, v in manifest.items() if k != "base_sha256"}):
        (folder / "manifest.json").write_text(json.dumps(broken))
        with pytest.raises(PlasticError, match="malformed"):
            shipped_taught("oracle", "k", base, root)
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(PlasticError, match="unreadable"):
        shipped_taught("oracle", "k", base, root)
    (src / "taught.json").write_text(json.dumps({"key": "k", "shipped": True}))
    with pytest.raises(PlasticError, match="not taught here"):     # a copy is not re-shipped
        write_shipped_taught(src, "base", "test", root=root)


def test_the_packaged_oracle_matches_its_manifest_and_was_taught_from_the_shipped_receiver():
    folder = SHIPPED_TAUGHT / "oracle"
    manifest = read_manifest(folder)
    assert mismatches(folder, manifest) == []
    family = read_manifest(shipped_dir("sandbox"))
    assert manifest["base_sha256"] == family["files"]["receiver/model.safetensors"]["sha256"]
    assert "--ship-oracle" in manifest["command"] and "shipped_taught=false" in manifest["command"]


@pytest.mark.parametrize("config", [LadderConfig, TransferConfig])
def test_the_default_ladder_and_transfer_teach_the_packaged_oracle(tmp_path, config):
    """The packaged oracle is what the default ladder and transfer runs (and the demo) would
    teach: their teaching key is the manifest's (else they would silently teach it again)."""
    cfg = config(out=str(tmp_path / "run"), progress=False)
    lad = Ladder(cfg)
    assert (teaching_key(cfg.receiver, Facts(lad).facts, cfg)
            == read_manifest(SHIPPED_TAUGHT / "oracle")["key"])


@pytest.mark.parametrize("extra", [[], ["--quick", "--set", "shipped_taught=false"],
                                   ["--set", "shipped_taught=false", "--set",
                                    "receiver=quick:receiver"]])
def test_ship_oracle_is_refused_before_any_work_unless_the_sandbox_oracle_is_taught_here(
        tmp_path, capsys, extra):
    from plasticlm.cli import main

    out = tmp_path / "run"
    assert main(["refine", "experiment", "ladder", "--ship-oracle", "--set", f"out={out}",
                 *extra]) == 2
    assert "--ship-oracle ships the sandbox receiver's oracle" in capsys.readouterr().err
    assert not out.exists()
