"""The shipped sandbox family: installed from the package when the cache has none (every hash
checked first), refused with what to do when a file differs, rebuilt by `models pretrain`,
and the repository's own copy current with the preset definitions."""

import json
import os
import shutil

import pytest

from plasticlm.cli import main
from plasticlm.errors import PlasticError
from plasticlm.sandbox import (
    ensure_sandbox_models,
    get_preset,
    preset_dir,
    pretrain_preset,
    shipped,
)
from plasticlm.sandbox import pretrain as pretrain_module
from plasticlm.sandbox.pretrain import member_key


def keys(preset: str) -> dict[str, str]:
    p = get_preset(preset)
    return {m.name: member_key(p, m) for m in p.models}


@pytest.fixture(scope="module")
def built_quick(tmp_path_factory):
    built = tmp_path_factory.mktemp("built")
    return built, pretrain_preset("quick", built, progress=False)


@pytest.fixture
def shipped_quick(built_quick, tmp_path, monkeypatch):
    """The quick preset pre-trained once, shipped into a package folder of the test's own,
    and the cache emptied: what a fresh clone with a shipped family sees."""
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", tmp_path / "family")
    shipped.write_shipped("quick", *built_quick[:1], keys("quick"), "test", built_quick[1])
    shutil.rmtree(preset_dir("quick"), ignore_errors=True)
    yield tmp_path / "family" / "quick"
    shutil.rmtree(preset_dir("quick"), ignore_errors=True)


def no_training(*args, **kwargs):
    raise AssertionError("pre-trained although a matching shipped family exists")


def test_a_fresh_cache_installs_the_shipped_family_without_training(shipped_quick,
                                                                     monkeypatch):
    monkeypatch.setattr(pretrain_module, "pretrain_preset", no_training)
    paths = ensure_sandbox_models("quick", progress=False)
    manifest = json.loads((shipped_quick / "manifest.json").read_text())
    assert manifest["files"] and manifest["command"] == "test"
    assert set(manifest["versions"]) >= {"torch", "transformers", "plasticlm"}
    root = preset_dir("quick")
    for rel, want in manifest["files"].items():
        assert shipped.sha256(root / rel) == want["sha256"], rel
    assert not any("checkpoint" in rel for rel in manifest["files"])
    from plasticlm.models import load_causal_lm

    model, tok = load_causal_lm(paths["receiver"])
    assert model.config.vocab_size >= len(tok)
    ensure_sandbox_models("quick", progress=False)   # installed once, then reused as it is


def test_a_shipped_file_that_differs_is_refused_before_anything_is_copied(shipped_quick,
                                                                          monkeypatch):
    monkeypatch.setattr(pretrain_module, "pretrain_preset", no_training)
    weights = next(shipped_quick.rglob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(PlasticError, match="does not match its manifest.*git checkout"):
        ensure_sandbox_models("quick", progress=False)
    assert not (preset_dir("quick") / "manifest.json").exists()


def test_an_installed_copy_that_changed_is_refused_with_what_to_do(shipped_quick,
                                                                   monkeypatch):
    monkeypatch.setattr(pretrain_module, "pretrain_preset", no_training)
    ensure_sandbox_models("quick", progress=False)
    (preset_dir("quick") / "receiver" / "config.json").write_text("{}")
    with pytest.raises(PlasticError, match="does not match its manifest.*delete"):
        ensure_sandbox_models("quick", progress=False)


def test_an_unchanged_installed_copy_is_hashed_once_per_process_and_a_rewrite_again(
        shipped_quick, monkeypatch):
    """The second load of the family in a process hashes nothing; a file rewritten with its
    size kept (a new mtime) is hashed again and refused."""
    monkeypatch.setattr(pretrain_module, "pretrain_preset", no_training)
    ensure_sandbox_models("quick", progress=False)            # installed and checked
    root = preset_dir("quick")
    hashed = []
    sha256 = shipped.sha256
    monkeypatch.setattr(shipped, "sha256", lambda path: hashed.append(path) or sha256(path))
    monkeypatch.setattr(shipped, "_VERIFIED", set())          # a new process
    ensure_sandbox_models("quick", progress=False)
    files = shipped.read_manifest(root)["files"]
    assert len(hashed) == len(files)                          # the first load checks all
    ensure_sandbox_models("quick", progress=False)
    assert len(hashed) == len(files)                          # the second hashes nothing
    weights = next(root.rglob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    before = weights.stat()
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    assert weights.stat().st_size == before.st_size
    with pytest.raises(PlasticError, match="does not match its manifest.*delete"):
        ensure_sandbox_models("quick", progress=False)


def test_a_shipped_family_of_another_preset_definition_is_not_installed(shipped_quick,
                                                                       monkeypatch):
    manifest = json.loads((shipped_quick / "manifest.json").read_text())
    manifest["member_keys"]["receiver"] = "an older definition"
    (shipped_quick / "manifest.json").write_text(json.dumps(manifest))
    calls = []
    monkeypatch.setattr(pretrain_module, "pretrain_preset",
                        lambda *a, **k: calls.append(a) or no_training())
    with pytest.raises(AssertionError):
        ensure_sandbox_models("quick", progress=False)
    assert calls, "the stale shipped family was installed instead of pre-training"


def test_pretrain_rebuilds_an_installed_shipped_family(shipped_quick, capsys):
    ensure_sandbox_models("quick", progress=False)
    assert (preset_dir("quick") / "manifest.json").exists()
    assert main(["models", "pretrain", "--preset", "quick"]) == 0
    assert not (preset_dir("quick") / "manifest.json").exists()   # trained here now
    assert "probe" in capsys.readouterr().out.lower()


def test_the_repositorys_shipped_family_is_whole_and_current():
    """The family in the package matches its manifest byte for byte and was built from the
    preset definitions in this tree (a changed preset must be shipped again:
    `plasticlm models pretrain --preset sandbox --force --ship`)."""
    manifest = shipped.read_manifest(shipped.shipped_dir("sandbox"))
    assert manifest is not None, "no shipped sandbox family in the package"
    assert shipped.mismatches(shipped.shipped_dir("sandbox"), manifest) == []
    assert manifest["member_keys"] == keys("sandbox")
    assert manifest["command"].startswith("plasticlm models pretrain --preset sandbox")
