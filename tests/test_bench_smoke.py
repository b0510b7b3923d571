"""Every bench script keeps a ``--smoke`` mode (issue 37): ``python bench/NAME.py --smoke``
runs the bench's own code at its tiniest sizes, exits 0 and writes nothing under
bench/results/. Scripts are found by glob, so a new bench without ``--smoke`` fails here.

The smoke runs are subprocesses started two at a time (2 cores, one torch thread each) once
the quick sandbox family they share is trained; each test waits for its own. Those that start
servers of their own (Flower's simulation; a fuser registry and three peers) run only with
``PLASTICLM_BENCH_SMOKE=all`` in the environment. Without them the file takes about two
minutes on 2 cores, 30 s of it training the quick family (shared with the other tests in a
full run), so the runs are in the slow lane (`make test-slow`, which CI runs); that every
script has a ``--smoke`` mode is checked in `make test`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from plasticlm.env import THREADS_ENV

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py"))
ALL = os.environ.get("PLASTICLM_BENCH_SMOKE") == "all"
# smoke runs that start servers of their own (opt-in): 20-40 s on 2 idle cores, a minute or
# more on busy ones, where the others take 5-13 s
SLOW = {"fednl_realshape_memory": "Flower's simulation runtime (SuperLink, Ray, 2 clients)",
        "refine_network": "a registry and three `refine serve` processes"}
# the real-shape model these build on first use; built here first, never by two at once
SHAPE_USERS = {"padding_backends", "fednl_realshape_memory"}
TIMEOUT = {"fednl_realshape_memory": 400, "refine_network": 300}
DEFAULT_TIMEOUT = 240


def _params():
    for name in SCRIPTS:
        marks = []
        if name in SLOW and not ALL:
            marks.append(pytest.mark.skip(reason=f"{SLOW[name]}: set PLASTICLM_BENCH_SMOKE=all"))
        yield pytest.param(name, marks=marks, id=name)


def _results_state() -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under bench/results/: a rewrite shows even when the
    content is the same."""
    return {str(p.relative_to(RESULTS)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in RESULTS.rglob("*") if p.is_file()}


def _changes(before: dict, after: dict) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def _run(name: str, tmp: Path) -> dict:
    """``bench/NAME.py --smoke`` with one torch thread; its temp folders go under ``tmp``."""
    env = {**os.environ, THREADS_ENV: "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", "TMPDIR": str(tmp)}
    before, t0 = _results_state(), time.time()
    # its own process group, so that a timeout also ends the servers or Flower it started
    proc = subprocess.Popen([sys.executable, str(BENCH / f"{name}.py"), "--smoke"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, rc = proc.communicate(timeout=TIMEOUT.get(name, DEFAULT_TIMEOUT))[0], proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, rc = proc.communicate()[0], None
    return {"rc": rc, "output": out, "seconds": time.time() - t0,
            "changed": _changes(before, _results_state())}


@pytest.fixture(scope="module")
def smoke_runs(request) -> dict[str, Future]:
    """Every selected script's smoke run, started in the background two at a time (in the
    order of the tests) once what they share is built: the quick sandbox family and, where
    two scripts need it, the 1-layer real-shape model."""
    from plasticlm.sandbox import ensure_sandbox_models, resolve_model_spec

    selected = [item.callspec.params["name"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")
                and not item.get_closest_marker("skip")]
    ensure_sandbox_models("quick", progress=False)
    if len(SHAPE_USERS & set(selected)) > 1:
        resolve_model_spec("shape:qwen2.5-0.5b@1")
    # a short temp path: Ray's sockets (Flower's simulation) must fit a unix socket's name
    with tempfile.TemporaryDirectory(prefix="bench-smoke-", ignore_cleanup_errors=True) as tmp:
        pool = ThreadPoolExecutor(max_workers=2)
        runs = {}
        for i, name in enumerate(selected):
            (Path(tmp) / str(i)).mkdir()
            runs[name] = pool.submit(_run, name, Path(tmp) / str(i))
        yield runs
        pool.shutdown(wait=True, cancel_futures=True)


def test_every_bench_is_found_and_has_a_smoke_mode():
    assert len(SCRIPTS) >= 18 and "gpu_check" in SCRIPTS
    missing = [n for n in SCRIPTS if "--smoke" not in (BENCH / f"{n}.py").read_text()]
    assert not missing, f"bench scripts without --smoke: {missing}"


# about two minutes for the file (the runs go two at a time): the slow lane
@pytest.mark.slow
@pytest.mark.parametrize("name", list(_params()))
def test_bench_smoke(name, smoke_runs):
    assert "--smoke" in (BENCH / f"{name}.py").read_text(), f"bench/{name}.py has no --smoke"
    r = smoke_runs[name].result()
    tail = r["output"][-4000:]
    assert r["rc"] is not None, f"bench/{name}.py --smoke ran past its timeout:\n{tail}"
    assert r["rc"] == 0, f"bench/{name}.py --smoke exited {r['rc']}:\n{tail}"
    assert not r["changed"], (f"bench/{name}.py --smoke changed bench/results/ (or another "
                              f"smoke run did at the same time): {r['changed']}")
    if name == "gpu_check" and not _has_cuda():
        assert "gpu_check --smoke: skipped, no CUDA device" in r["output"]
    if name == "eval_reference" and not (ROOT.parent / "shared" / "data").is_dir():
        assert "eval_reference --smoke: skipped" in r["output"]


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
