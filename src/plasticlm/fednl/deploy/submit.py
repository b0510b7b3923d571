"""``flwr run --stream`` of a Flower app, with the run's final status as the outcome.

Flower 1.42's ``flwr run --stream`` exits 0 once the SuperLink has accepted the run, whatever
becomes of it: the log stream (the Control API's ``StreamLogs``) carries log lines only and
ends when the run is finished, completed or failed, and ``flwr run`` returns after it
without asking for the status (``flwr/cli/run/run.py``, ``flwr/cli/log.py``). The status is
the Control API's, as ``flwr ls --run-id N --format json`` gives it: ``finished:completed``,
``finished:failed`` or ``finished:stopped``. So a run is submitted with ``flwr run --format
json`` (which names its id), followed with ``flwr log N --stream`` (from its first line, as
``flwr run --stream`` does) and judged by ``flwr ls``: all three Flower's own commands.

With an operator secret file, every one of them carries it (as Flower's CLI carries the token
of ``flwr login``) from a private copy of the caller's FLWR_HOME: the operator of a plasticlm
SuperLink who is not its owner on its host (another user, another machine over TLS).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flwr.supercore.utils import get_flwr_home

from plasticlm.errors import PlasticError
from plasticlm.fednl.deploy.processes import APP_DIR, flower_bin
from plasticlm.fednl.deploy.superlink import store_operator_secret

log = logging.getLogger("plasticlm.fednl")
COMPLETED = "finished:completed"


@dataclass(frozen=True)
class RunOutcome:
    """A submitted run as ``flwr ls`` reports it once its log stream has ended."""

    run_id: int
    status: str     # e.g. "finished:completed", "finished:failed"
    details: str    # Flower's status details ("" when it gives none)

    @property
    def completed(self) -> bool:
        return self.status == COMPLETED


def submit(superlink: str, app: str | Path = APP_DIR, run_config: list[str] = (),
           federation_config: list[str] = (),
           operator_secret_file: str | Path | None = None) -> RunOutcome:
    """``flwr run APP SUPERLINK --stream`` with ``--run-config``/``--federation-config`` as
    ``flwr run`` takes them (each a TOML file or ``'key=value ...'``): the run's log goes
    to stdout as it comes; returns its outcome. A run that Flower refuses to start (a key
    the app does not have, an unknown connection) raises PlasticError with Flower's reason.
    ``operator_secret_file``: the SuperLink's operator secret, sent with every call."""
    if not (Path(app) / "pyproject.toml").is_file():
        raise PlasticError(f"{app} is not a Flower app: it has no pyproject.toml")
    options = [*(a for c in run_config for a in ("--run-config", c)),
               *(a for c in federation_config for a in ("--federation-config", c))]
    with operator_env(superlink, operator_secret_file) as env:
        started = _flwr_json(env, "run", str(app), superlink, *options)
        run_id = int(started["run-id"])
        log.info("run %d started on %s; its log follows", run_id, superlink)
        # the log from the run's first line until the run is finished, however it ends
        subprocess.run([flower_bin("flwr"), "log", str(run_id), superlink, "--stream"],
                       env=env, check=False)
        runs = _flwr_json(env, "ls", "--run-id", str(run_id), superlink)["runs"]
    if len(runs) != 1:
        raise PlasticError(f"flwr ls --run-id {run_id} {superlink} lists {len(runs)} runs")
    return RunOutcome(run_id, runs[0]["status"], runs[0].get("status-details") or "")


@contextmanager
def operator_env(superlink: str, secret_file: str | Path | None = None) -> Iterator[dict]:
    """The environment of ``flwr`` calls to the connection ``superlink``: the caller's (its
    FLWR_HOME), or with ``secret_file`` a private FLWR_HOME (0700, removed after) holding
    the caller's connections and the secret for that connection's address."""
    env = dict(os.environ, FLWR_DISABLE_UPDATE_CHECK="1")
    if secret_file is None:
        yield env
        return
    config = get_flwr_home() / "config.toml"
    try:
        connection = tomllib.loads(config.read_text())["superlink"][superlink]
        address = str(connection["address"])
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as e:
        raise PlasticError(f"no address for the connection {superlink!r} in {config} "
                           f"({type(e).__name__}: {e})") from None
    if connection.get("insecure", False) and not _loopback_literal(address):
        # flwr sends the stored token on every call: over plain HTTP to another host it would
        # cross the network in the clear (the gate refuses it, but too late)
        raise PlasticError(f"the connection {superlink!r} ({address}) is insecure and not on "
                           "loopback: the operator secret is sent only over TLS or to "
                           "127.0.0.1/::1")
    home = Path(tempfile.mkdtemp(prefix="plasticlm-operator-"))
    try:
        shutil.copyfile(config, home / "config.toml")
        store_operator_secret(home, address, secret_file)
        yield dict(env, FLWR_HOME=str(home))
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _flwr_json(env: dict, command: str, *args: str) -> dict:
    """``flwr COMMAND ARGS --format json``'s answer; Flower's reason when it says no (its JSON
    mode exits 0 with ``"success": false``)."""
    done = subprocess.run([flower_bin("flwr"), command, *args, "--format", "json"],
                          capture_output=True, text=True, env=env)
    try:
        answer = json.loads(done.stdout)
    except json.JSONDecodeError:
        answer = {}
    if done.returncode != 0 or not answer.get("success"):
        # its JSON error is the output it had captured, then the reason: the last line
        lines = str(answer.get("error-message") or done.stderr or done.stdout).splitlines()
        why = next((x.strip() for x in reversed(lines) if x.strip()), "no reason given")
        raise PlasticError(f"flwr {command} refused: {why[:500]}")
    return answer


def _loopback_literal(address: str) -> bool:
    """Whether ``host:port`` (``[v6]:port`` too) names a loopback address literally."""
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
