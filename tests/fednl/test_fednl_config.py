"""FedNL's run config: the Flower app's run config mirrors it, it travels once per run as
Flower's run config (a message carries the round only), experiments are overrides of it, and
a typo in a choice is refused at load with the choices listed. No training here."""

import tomllib
from pathlib import Path

import pytest
import tomli_w
import torch
from flwr.app import ConfigRecord, Context, MessageType, RecordDict
from flwr.common.config import get_fused_config_from_dir, parse_config_args
from flwr.supercore.task_identity import TaskIdentity

from plasticlm.config import from_dict, load_config, override, preset_path, to_dict
from plasticlm.errors import PlasticError
from plasticlm.experiments.fednl.variants import ExperimentConfig, federated_config, variants
from plasticlm.fednl.config import (
    RUN_DIR_KEY,
    FedNLConfig,
    app_config,
    flower_run_config,
    from_flower_run_config,
    run_of,
)
from plasticlm.fednl.deploy.processes import APP_DIR
from plasticlm.fednl.flower.checkpoint import Checkpointer
from plasticlm.fednl.flower.messages import pack_theta
from plasticlm.fednl.flower.strategy import ThetaAverage
from plasticlm.fednl.registries import AGGREGATORS, FEDERATED_METHODS

ROOT = Path(__file__).resolve().parents[2]

# a run config with something other than the default in every section
CHANGES = {"name": "cfg-test", "seed": 7, "model": "sandbox-quick:receiver",
           "data.source": "sandbox-quick", "data.split": "dirichlet", "data.num_clients": 3,
           "data.alpha": 0.25, "data.max_train": 12, "method.name": "fedprox",
           "method.window": 32, "method.fedprox.mu": 0.5, "memory.layers": "0,1",
           "memory.mix": "additive", "memory.decay": True, "train.rounds": 6,
           "train.lr": 1e-3, "train.segment_tokens": 16, "federation.min_clients": 3,
           "federation.transfer_dtype": "float16", "aggregation.rule": "trimmed_mean",
           "aggregation.trim": 0.1, "eval.local_eval": "last", "outputs.out": "elsewhere",
           "outputs.client_state_dir": "/tmp/states"}


@pytest.fixture(scope="module")
def cfg() -> FedNLConfig:
    return override(FedNLConfig(), CHANGES)


def test_the_apps_run_config_is_the_run_configs_defaults():
    """``[tool.flwr.app.config]`` of the Flower app is FedNLConfig's keys with their defaults
    and the run folder: the two cannot drift apart."""
    pyproject = tomllib.loads((APP_DIR / "pyproject.toml").read_text())
    assert pyproject["tool"]["flwr"]["app"]["config"] == app_config()
    assert set(app_config()) == set(to_dict(FedNLConfig())) | {RUN_DIR_KEY}


def test_the_run_config_round_trips_through_flowers_keys(cfg, tmp_path):
    assert cfg != FedNLConfig()
    assert from_flower_run_config(flower_run_config(cfg)) == cfg
    assert from_flower_run_config({**flower_run_config(cfg), RUN_DIR_KEY: "x"}) == cfg
    # what `flwr run --run-config FILE.toml` makes of app_config(cfg): Flower's own parsing
    # of the file, fused with the app's defaults, is the run config the apps read
    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(app_config(cfg, tmp_path / "run")))
    run_config = get_fused_config_from_dir(APP_DIR, parse_config_args([str(path)]))
    assert run_config == {**flower_run_config(cfg), RUN_DIR_KEY: str(tmp_path / "run")}
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config=run_config)
    assert run_of(context) == (cfg, tmp_path / "run")
    # with no run folder given: outputs.out/name
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config=flower_run_config(cfg))
    assert run_of(context) == (cfg, Path("elsewhere") / "cfg-test")
    # a key the app does not have is refused by Flower itself
    with pytest.raises(ValueError, match="not present"):
        get_fused_config_from_dir(APP_DIR, {"train.roundz": 3})


def test_the_committed_deployment_config_is_a_run_config():
    """configs/fednl-deploy.toml (the README's `flwr run ... --run-config`) has only the
    app's keys and loads as a FedNLConfig."""
    path = ROOT / "configs" / "fednl-deploy.toml"
    run_config = get_fused_config_from_dir(APP_DIR, parse_config_args([str(path)]))
    cfg = from_flower_run_config(run_config)
    assert cfg == load_config(FedNLConfig, path)
    assert cfg.data.split == "dirichlet" and cfg.method.name == "fednl"


class FakeGrid:
    def get_node_ids(self):
        return [3, 1, 2]


def test_a_message_carries_theta_and_the_round_and_no_config(cfg, tmp_path, monkeypatch):
    # the ServerApp's process knows its run (Flower sets this before the ServerApp runs)
    for key in ("_task_id", "_run_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, key, 1)
    strategy = ThetaAverage(cfg, Checkpointer(tmp_path, cfg), start_round=2, num_nodes=3)
    theta = {"w": torch.ones(2, 3), "gate_logit": torch.zeros(2)}
    for configure, kind in ((strategy.configure_train, MessageType.TRAIN),
                            (strategy.configure_evaluate, MessageType.EVALUATE)):
        msgs = list(configure(1, pack_theta(theta, "float32"), ConfigRecord(), FakeGrid()))
        assert [m.metadata.dst_node_id for m in msgs] == [1, 2, 3]
        for m in msgs:
            assert m.metadata.message_type == kind
            assert set(m.content.keys()) == {"arrays", "config"}
            # the round of the run (resumed after round 2), nothing else
            assert dict(m.content["config"]) == {"server-round": 3}
            assert set(m.content["arrays"].keys()) == set(theta)


@pytest.mark.parametrize("experiment", ["niah", "openbook", "mmlu"])
def test_every_experiment_row_is_the_base_run_with_its_overrides(experiment, tmp_path):
    cfg = load_config(ExperimentConfig, None, [
        f"experiment={experiment}", "run.aggregation.rule=median", "run.train.rounds=7",
        "run.data.max_test=5"], preset=preset_path("fednl", "experiment-quick"))
    rows = variants(cfg)
    assert len(rows) >= 3
    for v in rows:
        fcfg = federated_config(cfg, v, 1, tmp_path)
        assert fcfg.aggregation.rule == "median", v.label
        # a row that sets its own rounds (the lever "3x rounds") scales the base run's
        assert fcfg.train.rounds == dict(v.changes).get("train.rounds", 7), v.label
        assert fcfg.train.rounds == (21 if "3x rounds" in v.label else 7), v.label
        assert fcfg.data.max_test == 5, v.label
        assert fcfg.data.source == "sandbox-quick" and fcfg.seed == 1
        assert fcfg.method.window == v.window
        # the row's own overrides, and nothing else, differ from the base run
        expected = override(cfg.run, {**dict(v.changes), "name": fcfg.name, "seed": 1,
                                      "outputs.out": str(tmp_path),
                                      "data.split": fcfg.data.split})
        assert fcfg == expected, v.label


@pytest.mark.parametrize("setting, choices", [
    ("method.name=fedavgg", ", ".join(FEDERATED_METHODS.names())),
    ("aggregation.rule=meen", ", ".join(AGGREGATORS.names())),
    ("data.split=nope", "'domain', 'dirichlet', 'niah', 'openbook' or 'iid'"),
    ("memory.mix=x", "'convex' or 'additive'"),
])
def test_a_typo_in_a_choice_is_refused_at_load_with_the_choices(setting, choices):
    key = setting.split("=")[0]
    for cls, prefix in ((FedNLConfig, ""), (ExperimentConfig, "run.")):
        with pytest.raises(PlasticError) as e:
            load_config(cls, None, [prefix + setting])
        assert f"config {prefix}{key}:" in str(e.value) and choices in str(e.value)
        assert "\n" not in str(e.value)


DOCS = [ROOT / "README.md", ROOT / "docs" / "fednl.md", ROOT / "docs" / "getting-started.md",
        ROOT / "docs" / "real-models.md", ROOT / "docs" / "results" / "fednl.md",
        ROOT / "docs" / "reliability.md"]


def test_the_docs_fednl_commands_set_keys_that_exist():
    """Every `--set KEY=...` of a `plasticlm fednl run/compare/experiment` command in the docs
    names a key of the config it overrides (commands wrapped over lines included)."""
    import re

    from plasticlm.config import field_docs

    keys = {"run": {k for k, _, _ in field_docs(FedNLConfig)},
            "experiment": {k for k, _, _ in field_docs(ExperimentConfig)}}
    keys["compare"] = keys["run"]
    seen = 0
    for page in DOCS:
        text = re.sub(r"\s*\\?\n\s*", " ", page.read_text())
        for command, rest in re.findall(r"plasticlm fednl (run|compare|experiment)([^`#|]*)",
                                        text):
            for key in re.findall(r"--set '?([\w.]+)=", rest):
                assert key in keys[command], f"{page.name}: fednl {command} --set {key}"
                seen += 1
    assert seen >= 10


def test_the_flat_method_keys_of_earlier_versions_load_as_each_methods_own(caplog):
    """A run folder saved before the baselines' knobs moved into their own configs still
    resumes: ``method.prox_mu`` is read as ``method.fedprox.mu`` (with a warning); both at once
    is refused in one line."""
    cfg = from_dict(FedNLConfig, {"method": {"prox_mu": 0.3, "ala_steps": 2, "si_c": 0.5}})
    assert (cfg.method.fedprox.mu, cfg.method.fedala.steps, cfg.method.fedssi.c) == (0.3, 2, 0.5)
    assert "method.prox_mu is now method.fedprox.mu" in caplog.text
    with pytest.raises(PlasticError, match="method.prox_mu is now method.fedprox.mu, and both"):
        from_dict(FedNLConfig, {"method": {"prox_mu": 0.3, "fedprox": {"mu": 0.1}}})


def test_renamed_keys_load_inside_an_experiment_config_too():
    """The committed experiment results carry the old keys inside ``run``: they still load."""
    cfg = from_dict(ExperimentConfig, {"run": {"method": {"prox_mu": 0.7},
                                               "memory": {"conv": 2, "lora": "shared"}}})
    assert cfg.run.method.fedprox.mu == 0.7
    assert (cfg.run.memory.conv_size, cfg.run.memory.lora_scope) == (2, "shared")
