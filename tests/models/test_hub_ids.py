"""A hub id whose model cannot be had is refused at once, in one line, before any work: the
hub switched off (HF_HUB_OFFLINE) or unreachable, or no such model; a cached one passes."""

import os
import subprocess
import sys
import time

import pytest

from plasticlm.errors import PlasticError
from plasticlm.models import loading


def test_an_offline_hub_refuses_an_uncached_id_without_asking_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    asked = []
    monkeypatch.setattr("huggingface_hub.get_hf_file_metadata", lambda *a, **k: asked.append(a))
    with pytest.raises(PlasticError, match="not in the local Hugging Face cache, and the hub "
                                           "is off .*huggingface-cli download Qwen/Qwen9-0B"):
        loading.check_model_source("Qwen/Qwen9-0B")
    assert not asked


def test_an_unreachable_hub_is_asked_once_and_refused_in_one_line(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = []

    def unreachable(url, timeout):
        calls.append(timeout)
        raise OSError("[Errno -2] Name or service not known\nmore detail")
    monkeypatch.setattr("huggingface_hub.get_hf_file_metadata", unreachable)
    with pytest.raises(PlasticError) as e:
        loading.check_model_source("Qwen/Qwen9-0B")
    assert "did not give its config.json (" in str(e.value) and "\n" not in str(e.value)
    assert calls == [loading.HUB_TIMEOUT_S]


def test_a_cached_hub_id_passes_without_the_hub(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache",
                        lambda repo, name: str(tmp_path / name))
    loading.check_model_source("Qwen/Qwen9-0B")


def test_fednl_run_with_an_offline_hub_id_exits_2_at_once_and_writes_nothing(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PLASTICLM_HOME": str(tmp_path / "home")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "plasticlm.cli", "fednl", "run", "--set",
                           "model=Qwen/Qwen2.5-0.5B", "--set", "name=z", "--set",
                           f"outputs.out={tmp_path / 'runs'}"], env=env, capture_output=True,
                          text=True, timeout=120)
    took = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stderr[-400:]
    assert proc.stderr.strip().count("\n") == 0 and "HF_HUB_OFFLINE" in proc.stderr
    assert "--resume" not in proc.stderr
    assert not (tmp_path / "runs" / "z").exists()
    assert took < 30, took   # measured 16-17 s on the 2 shared cores under load
