"""``plasticlm fednl submit``: ``flwr run --stream`` of a Flower app that exits as the run
ended (flwr 1.42's own ``flwr run --stream`` exits 0 when the ServerApp fails), on a
SuperLink in simulation mode on loopback."""

import pytest

from plasticlm.cli import main
from plasticlm.env import THREADS_ENV
from plasticlm.fednl.deploy.simulation import CONNECTION, SimulationLink

# A Flower app whose ServerApp returns at once: a run that completes, in seconds.
NOOP_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "noop"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "plasticlm-tests"

[tool.flwr.app.components]
serverapp = "noop_app:server_app"
clientapp = "noop_app:client_app"

[tool.flwr.app.config]
rounds = 1
"""
NOOP_APP = """\
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

server_app = ServerApp()
client_app = ClientApp()


@server_app.main()
def main(grid, context):
    pass
"""


@pytest.fixture(scope="module")
def superlink():
    """A SuperLink in simulation mode, its connection named in its own FLWR_HOME."""
    with SimulationLink({THREADS_ENV: "1"}) as link, pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLWR_HOME", str(link.home))
        yield link


def test_a_run_the_server_app_refuses_exits_1_naming_its_status(superlink, capfd):
    """train.rounds=0 is a key the app has with a value its ServerApp refuses as it starts:
    the run is finished:failed, and the command says so and exits 1 (about 25 s: the
    simulation starts Ray before the ServerApp refuses)."""
    assert main(["fednl", "submit", CONNECTION, "--run-config", "train.rounds=0",
                 "--federation-config", "num-supernodes=2"]) == 1
    out, err = capfd.readouterr()
    assert "input should be greater than 0" in out      # the run's log, streamed
    (line,) = [x for x in err.splitlines() if x.startswith("plasticlm: error:")]
    assert "ended finished:failed" in line and "train.rounds" in line


@pytest.mark.slow   # 14 s on 2 shared cores (Ray starts): `make test-slow`, CI
def test_a_completed_run_exits_0(superlink, tmp_path, capfd):
    """A Flower app whose ServerApp returns at once: finished:completed, exit 0. In the slow
    lane although under 30 s: the default lane is at its 10-minute budget, and the failed
    run above already shows the status is read."""
    app = tmp_path / "noop"
    app.mkdir()
    (app / "pyproject.toml").write_text(NOOP_PYPROJECT)
    (app / "noop_app.py").write_text(NOOP_APP)
    assert main(["fednl", "submit", CONNECTION, "--app", str(app),
                 "--federation-config", "num-supernodes=1"]) == 0
    assert "plasticlm: error" not in capfd.readouterr().err


def test_a_run_flower_refuses_to_start_exits_2_with_its_reason(superlink, capfd):
    assert main(["fednl", "submit", CONNECTION, "--run-config", "train.colour=1"]) == 2
    err = capfd.readouterr().err
    assert "flwr run refused" in err and "Invalid run configuration" in err
