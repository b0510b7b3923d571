"""FedRefine's configs: typed and frozen, every field with its help, a typo refused at load
with the valid choices listed, and every committed fuser and run config still read."""

import dataclasses
import json
from pathlib import Path

import pytest

from plasticlm.config import describe, field_docs, from_dict, load_config, preset_path
from plasticlm.errors import PlasticError
from plasticlm.experiments.refine.experiment import ExperimentConfig
from plasticlm.experiments.refine.ladder import ROWS, TransferConfig
from plasticlm.refine.fusers.fuser_config import CONFIG_NAME, FuserConfig, read_fuser_config
from plasticlm.refine.fusers.train import FuserTrainConfig
from plasticlm.refine.modes import RefineConfig
from plasticlm.refine.wire.serving import ServiceConfig

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
CONFIGS = [FuserConfig, FuserTrainConfig, RefineConfig, ExperimentConfig, TransferConfig,
           ServiceConfig]
SIZES = dict(receiver_layers=2, receiver_kv_heads=1, receiver_head_dim=8,
             transmitter_layers=3, transmitter_kv_heads=2, transmitter_head_dim=4)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_refine_config_field_has_help(cls):
    rows = field_docs(cls)
    assert rows and all(help_text for _, _, help_text in rows), \
        [key for key, _, help_text in rows if not help_text]
    if cls is not FuserConfig:            # --help of the commands (FuserConfig has no defaults)
        assert describe(cls).count("\n") == len(rows) - 1


def test_committed_fuser_folders_and_run_configs_still_read():
    fusers = sorted(RESULTS.rglob(CONFIG_NAME))
    assert len(fusers) >= 30
    for path in fusers:
        config = read_fuser_config(path.parent)
        if "kind" not in json.loads(path.read_text()):
            assert config.kind == "lowrank" and config.fuse_last   # what they were written as
    runs = sorted(RESULTS.glob("refine_*/config.json"))
    assert runs
    for path in runs:
        cfg = from_dict(ExperimentConfig, json.loads(path.read_text()))
        assert cfg.transmitters and cfg.fuser.epochs >= 1


def test_refine_typos_are_refused_at_load_with_the_choices():
    with pytest.raises(PlasticError, match=r"config rows\.0: input should be 'probe', 't2t'"):
        load_config(TransferConfig, None, ['rows=["genral"]'])
    assert set(ROWS) >= {"probe", "general", "co_c2c"}
    with pytest.raises(PlasticError, match="config fuser.mode: input should be 'aligned' or "
                       "'prefix', got 'alinged'"):
        load_config(TransferConfig, None, ["fuser.mode=alinged"])
    with pytest.raises(PlasticError, match=r"config fuser\.epoch: unknown key \(known: .*"
                       r"epochs"):
        load_config(ExperimentConfig, None, ["fuser.epoch=3"])
    with pytest.raises(PlasticError, match="config order: input should be 'parallel' or "
                       "'sequence'"):
        from_dict(RefineConfig, {"order": "serial"})
    with pytest.raises(PlasticError, match="config layer_map: input should be 'last' or "
                       "'depth'"):
        from_dict(FuserConfig, {**SIZES, "layer_map": "middle"})
    with pytest.raises(PlasticError, match="config epochs: input should be greater than 0"):
        load_config(FuserTrainConfig, None, ["epochs=0"])
    with pytest.raises(PlasticError, match="config peers.0: .*not an http"):
        from_dict(ServiceConfig, {"peers": ["not a url"]})


def test_refine_cross_field_checks_and_frozen_configs():
    with pytest.raises(PlasticError, match="share='draft' needs mode='prefix'"):
        FuserTrainConfig(share="draft", draft_tokens=2)
    with pytest.raises(PlasticError, match="needs mode=prefix"):
        load_config(FuserTrainConfig, None, ["private=true"])
    with pytest.raises(PlasticError, match="overlap"):
        ExperimentConfig(eval_splits=("val",))
    with pytest.raises(PlasticError, match="draft row needs draft_tokens >= 1"):
        load_config(TransferConfig, None, ["draft_tokens=0"])
    assert load_config(TransferConfig, None, ["draft_tokens=0", 'rows=["general"]'])
    cfg = FuserTrainConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.epochs = 3
    with pytest.raises(ValueError):       # replace validates again
        dataclasses.replace(cfg, epochs=0)
    prefix = dataclasses.replace(cfg, mode="prefix", share="draft", draft_tokens=3)
    assert (prefix.mode, prefix.share, cfg.mode) == ("prefix", "draft", "aligned")


def test_refine_presets_and_saved_fuser_configs_round_trip(tmp_path):
    quick = load_config(TransferConfig, None, [], preset=preset_path("refine", "transfer-quick"))
    assert quick.fuser.hidden == 16 and quick.parties == ("quick:transmitter-llama",
                                                          "quick:receiver")
    config = FuserConfig(**SIZES, kind="lowrank", rank=4, mode="prefix", share="draft",
                         draft_tokens=2)
    (tmp_path / CONFIG_NAME).write_text(json.dumps(dataclasses.asdict(config)))
    assert read_fuser_config(tmp_path) == config
