"""`fednl run` stopped by Ctrl-C (SIGINT to the whole process group, as a terminal sends it)
and by SIGTERM (to the process alone, as `kill` sends it): it stops within seconds with one
line saying where and how to resume, no process of Flower or Ray is left, the last committed
round loads, and --resume continues the run from it (not from the start)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.flower.checkpoint import Checkpointer
from plasticlm.fednl.flower.stopping import RunStopped, StoppableGrid, StopRequest

ROUNDS = 6
# two clients and few test questions: the first round (Ray start-up) is the run's cost
ARGS = ["fednl", "run", "--quick", "--set", "data.max_test=4", "--set", "data.split=dirichlet",
        "--set", "data.num_clients=2", "--set", f"train.rounds={ROUNDS}", "--set",
        "name=stopped"]
STOP_SECONDS = 15.0


def committed(run_dir) -> int:
    pointer = run_dir / "checkpoint.json"
    return json.loads(pointer.read_text())["round"] if pointer.exists() else 0


def stop_after_a_round(out, sig: int, *extra: str) -> tuple[int, str, int]:
    """Start `fednl run`, send ``sig`` once a further round is committed; (exit status,
    stderr, the round committed when it was sent)."""
    run_dir = out / "stopped"
    before = committed(run_dir)
    log = out / f"stderr-{sig}.txt"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "plasticlm.cli", *ARGS, "--set",
                                 f"outputs.out={out}", *extra], stdout=subprocess.DEVNULL,
                                stderr=err,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                start_new_session=True)
    try:
        deadline = time.time() + 240
        while proc.poll() is None and committed(run_dir) <= before and time.time() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended before the signal: {log.read_text()}"
        at = committed(run_dir)
        sent = time.time()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)   # Ctrl-C reaches the whole foreground group
        else:
            proc.send_signal(sig)
        try:
            status = proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            status = None
        # Ray's workers leave once they see their raylet gone
        leftovers = True
        while leftovers and time.time() < sent + STOP_SECONDS + 10:
            try:
                os.killpg(proc.pid, 0)
                time.sleep(0.1)
            except ProcessLookupError:
                leftovers = False
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    name = signal.Signals(sig).name
    assert status is not None, f"still running {STOP_SECONDS:.0f}s after {name}"
    assert not leftovers, f"processes of the run still running {STOP_SECONDS + 10:.0f}s after {name}"
    return status, log.read_text(), at


@pytest.mark.slow   # 30-55 s on 2 cores: `make test-slow` (CI runs it after `make test`)
def test_ctrl_c_and_sigterm_stop_the_run_and_resume_continues_it(tmp_path):
    run_dir = tmp_path / "stopped"
    cfg = FedNLConfig()
    done_before = []
    for sig, extra, status_wanted in ((signal.SIGINT, (), 130),
                                      (signal.SIGTERM, ("--resume",), 143)):
        status, err, at = stop_after_a_round(tmp_path, sig, *extra)
        name = signal.Signals(sig).name
        assert status == status_wanted, err
        assert "Traceback" not in err, err
        last = err.strip().splitlines()[-1]
        done = committed(run_dir)
        assert last.startswith(f"plasticlm: stopped by {name} after round {done} of {ROUNDS}")
        assert "--resume" in last and str(run_dir) in last
        assert at <= done < ROUNDS
        # the last committed round loads, and the metrics hold exactly the rounds before it
        r, theta = Checkpointer(run_dir, cfg).latest({})
        assert r == done and theta
        records = Checkpointer(run_dir, cfg).records()
        assert [x["round"] for x in records] == list(range(1, done + 1))
        assert records[:len(done_before)] == done_before   # resumed, not restarted
        done_before = records
    # that a resumed run goes on to the end with the theta of an uninterrupted one:
    # test_fednl_flower.py::test_a_killed_run_resumes_to_the_same_final_metrics


class SlowGrid:
    """Two nodes; a reply comes after ``delay`` seconds (never when None)."""

    def __init__(self, delay):
        self.delay, self.t0 = delay, time.time()

    def get_node_ids(self):
        return [1, 2]

    def push_messages(self, messages):
        self.t0 = time.time()
        return ["m1", "m2"]

    def pull_messages(self, ids):
        if self.delay is None or time.time() < self.t0 + self.delay:
            return []
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in ids]


def test_a_stop_ends_the_wait_for_replies_at_once(tmp_path):
    """The stop file (what a signal writes, or an operator's ``touch``) ends the server's wait."""
    stop = StopRequest(tmp_path)
    grid = StoppableGrid(SlowGrid(None), stop)
    threading.Timer(0.3, stop.set, (signal.SIGTERM,)).start()
    t0 = time.time()
    with pytest.raises(RunStopped):
        grid.send_and_receive([], timeout=60)   # Flower's own wait would last the minute
    assert time.time() - t0 < 2
    with pytest.raises(RunStopped):
        grid.get_node_ids()                     # the server's wait for nodes stops too
    assert stop.signum == signal.SIGTERM
    stop.clear()
    replies = StoppableGrid(SlowGrid(0.2), stop).send_and_receive([], timeout=60)
    assert sorted(m.metadata.reply_to_message_id for m in replies) == ["m1", "m2"]
