"""Runs tied to their owner: ``kill -9`` of the CLI in the middle of a FedNL round leaves no
process of the run behind and no round committed after it; two processes never write one
run folder at once (an exclusive lock, taken by run and resume alike, names its holder)."""

import json
import os
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from plasticlm.errors import PlasticError
from plasticlm.run_lock import RunLock

ARGS = ["fednl", "run", "--quick", "--set", "data.max_test=4", "--set", "data.split=dirichlet",
        "--set", "data.num_clients=2", "--set", "train.rounds=6", "--set", "name=owned"]


def committed(run_dir) -> int:
    pointer = run_dir / "checkpoint.json"
    return json.loads(pointer.read_text())["round"] if pointer.exists() else 0


def tagged(tag: str) -> list[psutil.Process]:
    """Every live process whose environment carries ``tag`` (the CLI's, inherited by all it
    started, whatever their session or parent now)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("PLASTICLM_TEST_TAG") == tag and p.status() != "zombie":
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


@pytest.mark.slow   # 36 s on 2 cores: `make test-slow` (CI runs it after `make test`)
def test_kill_9_of_the_cli_in_round_2_leaves_no_process_and_no_later_round(tmp_path):
    tag = uuid.uuid4().hex
    run_dir = tmp_path / "owned"
    log = tmp_path / "stderr.txt"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "plasticlm.cli", *ARGS, "--set",
                                 f"outputs.out={tmp_path}"], stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1",
                                         PLASTICLM_TEST_TAG=tag))
    try:
        deadline = time.time() + 240
        while proc.poll() is None and committed(run_dir) < 1 and time.time() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended before the kill: {log.read_text()}"
        at = committed(run_dir)
        assert at == 1 and len(tagged(tag)) > 1      # round 2 is under way, Flower is running
        proc.kill()                                  # SIGKILL: the CLI runs no handler at all
        proc.wait()
        deadline = time.time() + 20
        while tagged(tag) and time.time() < deadline:
            time.sleep(0.2)
        left = [" ".join(p.cmdline())[:80] for p in tagged(tag)]
        assert not left, f"still running 20 s after kill -9 of the CLI: {left}"
        time.sleep(2)
        assert committed(run_dir) == at, "a round was committed after its owner died"
    finally:
        for p in tagged(tag):
            p.kill()


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from plasticlm.run_lock import RunLock\n"
                               f"with RunLock({str(folder)!r}):\n"
                               "    print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(PlasticError, match=rf"in use by process {holder.pid}\b"):
            with RunLock(folder):
                pass
    finally:
        holder.kill()
        holder.wait()
    with RunLock(folder):    # the holder died (even by SIGKILL): the lock is free again
        pass


def test_the_lock_writes_nothing_but_its_pid_file_and_is_released(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    with RunLock(folder) as lock:
        assert sorted(p.name for p in folder.iterdir()) == [".plasticlm-lock"]
        assert (folder / ".plasticlm-lock").read_text().split()[0] == str(os.getpid())
        with pytest.raises(PlasticError, match="in use by process"):
            RunLock(folder).__enter__()       # one process, two writers: refused as well
    assert lock.fd is None
    with RunLock(folder):
        pass


def test_run_and_resume_of_a_held_folder_are_refused_before_any_work(tmp_path):
    """FedNL's run and resume and SCoL's meta-training take the lock; a held folder is neither
    cleared, resumed nor written."""
    from plasticlm.config import load_config
    from plasticlm.fednl.config import FedNLConfig
    from plasticlm.fednl.run import run_federated
    from plasticlm.scol.config import SCoLConfig
    from plasticlm.scol.meta import meta_train

    cfg = load_config(FedNLConfig, None, [f"outputs.out={tmp_path}", "name=held",
                                                 "model=sandbox-quick:receiver",
                                                 "data.source=sandbox-quick"])
    from plasticlm.outputs import prepare_output

    folder = tmp_path / "held"
    prepare_output(folder, "run")      # a run's folder, as a run leaves it
    with RunLock(folder):
        before = sorted(p.name for p in folder.iterdir())
        for resume in (False, True):
            with pytest.raises(PlasticError, match=rf"in use by process {os.getpid()}"):
                run_federated(cfg, resume=resume)
        with pytest.raises(PlasticError, match=rf"in use by process {os.getpid()}"):
            meta_train(None, None, [["a context"]], SCoLConfig(), folder, resume=True)
        assert sorted(p.name for p in folder.iterdir()) == before
