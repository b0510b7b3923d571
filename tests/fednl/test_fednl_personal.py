"""FedNL's nested split end to end (issue 41's lever): two clients with different data run
2 rounds of ``fednl-personal`` through the real ServerApp and ClientApp in one process.
Each client's gate must stay on the client: its replies carry the gate it received, the
server's gate never moves, each client starts its next round from its own gate, and the
experiment scores each client with its own gate; the shared rules still travel and average."""

import pytest
import torch
from inprocess_run import committed, distance, federate, mean
from safetensors.torch import load_file
from test_fednl_weighted_mean import CONFIG, COUNTS

from plasticlm.config import from_dict, override
from plasticlm.experiments.fednl import experiment
from plasticlm.experiments.fednl.variants import (
    PERSONAL_GATE,
    ExperimentConfig,
    Variant,
    client_theta,
)
from plasticlm.fednl.build import build_model
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.methods import FedNLPersonal, is_personal
from plasticlm.fednl.theta import get_theta, set_theta

pytestmark = pytest.mark.usefixtures("one_thread")

PERSONAL = {**CONFIG, "name": "personal", "method": {"name": "fednl-personal"}}


def split(theta: dict) -> tuple[dict, dict]:
    """(the personal entries, the shared ones)."""
    return ({k: v for k, v in theta.items() if is_personal(k)},
            {k: v for k, v in theta.items() if not is_personal(k)})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return federate(tmp_path_factory, PERSONAL, COUNTS)


def client_state(run_dir, pid: int, rnd: int) -> dict:
    return load_file(str(run_dir / "clients" / f"client{pid}" / f"state_{rnd:04d}.safetensors"))


def test_the_gate_is_the_personal_share():
    names = ["model.layers.0.self_attn.gate_logit", "model.layers.1.self_attn.gate_proj.weight",
             "model.layers.0.self_attn.memory_norm.weight", "model.layers.0.self_attn.lora_q.A",
             "model.layers.0.self_attn.beta_proj.weight"]
    assert [is_personal(n) for n in names] == [True, True, True, False, False]


def test_replies_carry_the_received_gate_and_the_trained_rules(run):
    _, grid, _, _ = run
    for key, sent in grid.sent.items():
        gate_sent, rules_sent = split(sent)
        gate_back, rules_back = split(grid.returned[key])
        assert gate_sent, "the run has no gate to keep"
        assert distance(gate_back, gate_sent) == 0.0, f"{key}: a client's own gate travelled"
        assert distance(rules_back, rules_sent) > 1e-4, f"{key}: the rules did not train"


def test_server_gate_stays_initial_and_rules_average(run):
    run_dir, grid, _, _ = run
    initial_gate, _ = split(grid.sent[1, 0])
    for rnd in (1, 2):
        gate, rules = split(committed(run_dir, rnd))
        assert distance(gate, initial_gate) == 0.0
        replies = [split(grid.returned[rnd, pid])[1] for pid in (0, 1)]
        assert distance(rules, mean(replies, [float(n) for n in COUNTS])) < 1e-5


def test_each_client_keeps_and_restarts_from_its_own_gate(run):
    run_dir, grid, starts, _ = run
    initial_gate, _ = split(grid.sent[1, 0])
    own = [{k[len("personal."):]: v for k, v in client_state(run_dir, pid, 1).items()}
           for pid in (0, 1)]
    assert distance(own[0], initial_gate) > 1e-4    # each client's gate trained ...
    assert distance(own[0], own[1]) > 1e-4          # ... to its own value
    for pid in (0, 1):
        gate, rules = split(starts[2, pid])
        assert distance(gate, own[pid]) == 0.0, f"client {pid} lost its gate between rounds"
        assert distance(rules, split(committed(run_dir, 1))[1]) < 1e-5


def test_the_experiment_scores_each_client_with_its_own_gate(run):
    run_dir, _, _, _ = run
    cfg = override(from_dict(FedNLConfig, PERSONAL),
                   {"outputs.out": str(run_dir.parent), "name": run_dir.name})
    final = committed(run_dir, 2)
    for pid in (0, 1):
        theta = client_theta(cfg, pid, final)
        gate, rules = split(theta)
        own = {k[len("personal."):]: v for k, v in client_state(run_dir, pid, 2).items()}
        assert distance(gate, own) == 0.0
        assert distance(rules, split(final)[1]) == 0.0


def test_personalise_without_state_is_the_global_theta():
    theta = {"layers.0.gate_logit": torch.zeros(2), "layers.0.lora_q.A": torch.ones(2, 2)}
    assert FedNLPersonal().personalise(theta, {}) == theta


def test_the_experiment_table_scores_each_client_with_its_own_gate(run, monkeypatch):
    """``fednl experiment`` scores client i's items with client i's gate (the table's row
    'fednl, personal gate'), the rules being the server's."""
    run_dir, _, _, tasks = run
    cfg = override(from_dict(FedNLConfig, PERSONAL),
                   {"outputs.out": str(run_dir.parent), "name": run_dir.name})
    model, tok = build_model(cfg)
    final = committed(run_dir, 2)
    set_theta(model, final)
    answered_with = {}

    def correct(task, model, tokenizer, batch_size=32):
        answered_with[task.name] = get_theta(model)
        return [1.0] * len(task.test)

    monkeypatch.setattr(type(tasks[0]), "correct", correct)
    monkeypatch.setattr(experiment, "federated_config", lambda *args: cfg)
    monkeypatch.setattr(experiment, "trained_model", lambda *args, **kw: (model, tok, None))
    monkeypatch.setattr(experiment, "tasks_for", lambda fcfg: tasks)
    experiment._score(ExperimentConfig(experiment="mmlu"), Variant(PERSONAL_GATE), 0,
                      run_dir.parent, progress=False)
    for pid, task in enumerate(tasks):
        gate, rules = split(answered_with[task.name])
        own = {k[len("personal."):]: v for k, v in client_state(run_dir, pid, 2).items()}
        assert distance(gate, own) == 0.0, f"client {pid} was scored without its own gate"
        assert distance(rules, split(final)[1]) == 0.0


def test_the_nested_split_is_refused_without_a_window_at_load():
    from plasticlm.errors import PlasticError

    with pytest.raises(PlasticError, match="needs an attention window"):
        from_dict(FedNLConfig, {"method": {"name": "fednl-personal", "window": 0}})
