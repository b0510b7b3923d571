"""SCoL's configs: help on every field, frozen, the committed results' configs still read, the
packaged preset loads, cross-field checks refused at load, and the sweep grid in the one
grammar."""

import dataclasses
import json
from pathlib import Path

import pytest

from plasticlm.config import describe, field_docs, from_dict, load_config, override, preset_path
from plasticlm.errors import PlasticError
from plasticlm.experiments.scol.calibrate import SweepConfig
from plasticlm.experiments.scol.setup import ExperimentConfig
from plasticlm.scol.config import SCoLConfig
from plasticlm.scol.consolidate import LoraTrainConfig

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
CONFIGS = (ExperimentConfig, SCoLConfig, LoraTrainConfig, SweepConfig)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_has_help(cls):
    rows = field_docs(cls)
    assert rows and all(help_ for _, _, help_ in rows), [k for k, _, h in rows if not h]
    text = describe(cls)
    if cls is ExperimentConfig:   # registry keys and Literals list their choices
        assert "scol.reward" in text and "supervised | loglik | intrinsic" in text
        assert "scol.forget_from" in text and "recent | all" in text


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_configs_are_frozen(cls):
    cfg = cls()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 3 if hasattr(cfg, "seed") else cfg.rank
    assert from_dict(cls, json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg


def test_committed_results_configs_still_read():
    read = 0
    for path in sorted(RESULTS.glob("scol_*.json")):
        report = json.loads(path.read_text())
        for key, cls in (("config", ExperimentConfig), ("sweep", SweepConfig)):
            if key in report:
                from_dict(cls, report[key])
                read += 1
    assert read >= 7


def test_quick_preset_and_overrides():
    cfg = load_config(ExperimentConfig, preset=preset_path("scol", "quick"))
    assert cfg.preset == "quick" and cfg.scol.k == 2 and cfg.scol.lora.steps == 2
    changed = override(cfg, {"scol.lora.replay": 0, "methods": ["scol", "fixed_last"]})
    assert changed.scol.lora.replay == 0 and changed.methods == ("scol", "fixed_last")
    assert cfg.scol.lora.replay == 4     # the original untouched


def test_ranges_and_cross_field_checks_refused_at_load():
    for bad, where in ((["eval_length=0"], "eval_length"), (["scol.k=0"], "scol.k"),
                       (["scol.ipo_tau=0"], "scol.ipo_tau"), (["methods=[]"], "methods"),
                       (["scol.lora.target_modules=[]"], "scol.lora.target_modules"),
                       (["chunk_tokens=4"], "chunk_tokens")):
        with pytest.raises(PlasticError, match=f"config {where}"):
            load_config(ExperimentConfig, None, bad)
    with pytest.raises(PlasticError, match="longbench_per_length draws items"):
        load_config(ExperimentConfig, None, ["longbench_per_length=2", "longbench=x.json"])
    with pytest.raises(PlasticError, match="max_layers 5 exceeds the model's 4 layers"):
        SCoLConfig(max_layers=5).check(4)


def test_sweep_grid_in_the_one_grammar():
    grid = load_config(SweepConfig, None, ['modules=["mlp"]', "lr=[1e-3,3e-3]", "steps=[2]",
                                           "replay=[0]", "layers=last"])
    assert [s["lr"] for s in grid.settings()] == [1e-3, 3e-3] and grid.layers == "last"
    for bad in ("lr=[0]", "steps=[0]", "replay=[-1]", "keep_legal=1.5", "rank=[]"):
        with pytest.raises(PlasticError, match=f"config {bad.split('=')[0]}"):
            load_config(SweepConfig, None, [bad])
