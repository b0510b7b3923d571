import os
from pathlib import Path

import pytest

from plasticlm.env import THREADS_ENV
from plasticlm.runtime import set_threads, threads

# Tests never reach a hub: a missing model must fail fast, not try the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The thread policy: 2 torch threads unless $PLASTICLM_THREADS says otherwise; in the
# environment, so that code under test calling set_threads() and subprocesses agree.
os.environ.setdefault(THREADS_ENV, "2")
set_threads()

ROOT = Path(__file__).resolve().parents[1]


def _shared_data() -> Path:
    env = os.environ.get("PLASTICLM_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder (../shared/data); tests using it skip when it is absent."""
    path = _shared_data()
    if not path.is_dir():
        pytest.skip(f"real data folder {path} is absent (set PLASTICLM_DATA to point to it)")
    return path


@pytest.fixture(autouse=True, scope="session")
def _isolated_home(tmp_path_factory):
    """One cache home for the whole session, out of the user's ~/.cache. Session-scoped so
    that it is in place before any module-scoped fixture (and inherited by subprocesses)."""
    old = os.environ.get("PLASTICLM_HOME")
    os.environ["PLASTICLM_HOME"] = str(tmp_path_factory.getbasetemp() / "plasticlm_home")
    yield
    if old is None:
        os.environ.pop("PLASTICLM_HOME", None)
    else:
        os.environ["PLASTICLM_HOME"] = old


@pytest.fixture(scope="module")
def one_thread():
    """One torch intra-op thread for a test module, restored after it."""
    with threads(1):
        yield
