"""FedNL end to end on Flower: the simulation runtime, kill-and-resume, and SuperLink +
SuperNodes on loopback. Uses the quick sandbox preset (seconds of pre-training)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from plasticlm.cli import main

QUICK = ["--quick", "--set", "data.max_test=6"]


def run_cli(out: Path, name: str, *extra: str) -> int:
    return main(["fednl", "run", *QUICK, "--set", f"outputs.out={out}", "--set", f"name={name}",
                 *extra])


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fed")
    assert run_cli(out, "ref", "--set", "train.rounds=3") == 0
    return out / "ref"


def test_two_rounds_of_fednl_on_the_simulation_runtime(reference_run):
    records = [json.loads(x) for x in (reference_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2, 3]
    for r in records:
        assert len(r["clients"]) == 5
        assert {"local_acc", "fed_acc", "drop", "train_loss", "domain"} <= set(
            next(iter(r["clients"].values())))
        # each client says where and in what it ran: the run's --device/--dtype (defaults)
        assert {c["runtime"] for c in r["clients"].values()} == {"cpu float32"}
        assert r["bytes_up"] > 0 and r["bytes_down"] == 2 * r["bytes_up"]
        # the aggregated gate of every memory layer, per head, logged each round
        assert r["alpha"] and all(0 < a < 1 for v in r["alpha"].values() for a in v)
    assert records[-1]["alpha"] != records[0]["alpha"]  # the gate moves across rounds
    # Flower's runtime installation is on (its default); the app declares no dependencies,
    # so it installs nothing and never asks a package index for plasticlm
    flower_log = (reference_run / "flower.log").read_text()
    assert "No additional application dependencies needed installation" in flower_log
    # the progress line logged per round carries the round's metrics
    from plasticlm.fednl.config import FedNLConfig
    from plasticlm.fednl.flower.strategy import progress_line

    cfg = FedNLConfig.from_json((reference_run / "config.json").read_text())
    line = progress_line(records[0], cfg)
    assert line.startswith("fednl round 1/3: fed acc ") and "train loss" in line
    assert "5 clients" in line and "MB up" in line
    summary = json.loads((reference_run / "summary.json").read_text())
    theta_bytes = summary["theta_bytes"]
    assert records[0]["bytes_up"] >= 5 * theta_bytes  # five clients each sent theta
    assert (reference_run / "accuracy.png").stat().st_size > 0
    assert (reference_run / "bytes.png").stat().st_size > 0
    # the final theta loads with the memory adapter's from_pretrained
    from plasticlm.memory import from_pretrained, meta_parameters
    from plasticlm.models import load_causal_lm
    from plasticlm.sandbox import sandbox_model

    base, _ = load_causal_lm(sandbox_model("receiver", preset="quick"))
    model = from_pretrained(base, reference_run / "final")
    assert len(meta_parameters(model)) > 0


@pytest.mark.slow   # 30 s on 2 cores: `make test-slow` (CI runs it after `make test`)
def test_a_killed_run_resumes_to_the_same_final_metrics(reference_run, tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "plasticlm.cli", "fednl", "run", *QUICK,
           "--set", f"outputs.out={tmp_path}", "--set", "name=killed",
           "--set", "train.rounds=3"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    pointer = tmp_path / "killed" / "checkpoint.json"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if pointer.exists() and json.loads(pointer.read_text())["round"] >= 1:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: Ray's workers too
    proc.wait()
    killed_at = json.loads(pointer.read_text())["round"]
    assert 1 <= killed_at < 3, "the run should have been killed mid-way"
    assert main(["fednl", "run", *QUICK, "--set", f"outputs.out={tmp_path}", "--set",
                 "name=killed", "--set", "train.rounds=3", "--resume"]) == 0
    ref = [json.loads(x) for x in (reference_run / "metrics.jsonl").read_text().splitlines()]
    got = [json.loads(x) for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in got] == [1, 2, 3]
    assert got[-1]["clients"] == ref[-1]["clients"]
    a = load_file(str(reference_run / "round_0003" / "theta.safetensors"))
    b = load_file(str(tmp_path / "killed" / "round_0003" / "theta.safetensors"))
    assert all((a[k] == b[k]).all() for k in a)


def test_a_finished_run_is_not_overwritten(reference_run, capsys):
    out, name = reference_run.parent, reference_run.name
    assert run_cli(out, name, "--set", "train.rounds=3") == 2
    assert "--resume" in capsys.readouterr().err


@pytest.mark.slow   # 30-55 s on 2 cores: `make test-slow` (CI runs it after `make test`)
def test_one_round_through_superlink_and_two_supernodes_over_tls_with_node_auth(tmp_path):
    """The deployment runtime: separate SuperLink and SuperNode processes on 127.0.0.1, over
    TLS with SuperNode authentication. Two rogue nodes that hold the CA certificate and claim
    partition 0 (one with a key nobody registered, one with none) are refused; the round runs
    with the two registered nodes only."""
    import time

    from plasticlm.config import from_dict
    from plasticlm.fednl.config import FedNLConfig, app_config
    from plasticlm.fednl.deploy.deployment import LocalFederation, make_node_key
    from plasticlm.fednl.deploy.processes import free_ports
    from plasticlm.sandbox import sandbox_model, sandbox_world

    sandbox_world("quick"), sandbox_model("receiver", preset="quick")  # built before the nodes
    cfg = from_dict(FedNLConfig, {
        "name": "deployed", "model": "sandbox-quick:receiver",
        "data": {"source": "sandbox-quick", "split": "dirichlet", "num_clients": 2,
                 "max_train": 8, "max_test": 4},
        "method": {"name": "fednl"},
        "train": {"rounds": 1, "local_steps": 2, "batch_size": 2}})
    run_dir = tmp_path / "run"
    with LocalFederation(tmp_path / "fed", nodes=2, tls=True, auth=True) as fed:
        private, _ = make_node_key(tmp_path / "rogue")           # never registered
        assert private.stat().st_mode & 0o777 == 0o600
        ports = free_ports(2)
        rogues = [fed.start_node(0, ports[0], ["--auth-supernode-private-key", str(private)],
                                 "rogue-key.log"),
                  fed.start_node(0, ports[1], [], "rogue-nokey.log")]
        deadline = time.time() + 120
        while time.time() < deadline and any(r.poll() is None for r in rogues):
            time.sleep(1)
        assert all(r.poll() not in (None, 0) for r in rogues), "a rogue node was not refused"
        assert "Failed to activate SuperNode" in (fed.workdir / "rogue-key.log").read_text()
        done = fed.run(app_config(cfg, run_dir), timeout=600)
        assert len(fed.registered_nodes()) == 2
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1]
    assert len(records[0]["clients"]) == 2 and records[0]["bytes_up"] > 0
    # the run config reached the ServerApp as given (Flower's run config, dotted keys)
    assert FedNLConfig.from_json((run_dir / "config.json").read_text()) == cfg
