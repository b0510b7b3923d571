"""Trust only what plasticlm wrote (issue 56, item 3), from each reproducer: nothing is trusted
for lying in the cache home, a marker covers only the names plasticlm creates in its folder,
a marked folder of another kind is refused, and no install or write follows a symbolic link.
After each, the user's files are compared byte for byte."""

import json
import os
from pathlib import Path

import pytest

from plasticlm.cli import main
from plasticlm.errors import PlasticError
from plasticlm.home import cache_root
from plasticlm.nofollow import write_text
from plasticlm.outputs import MARKER, atomic_output, prepare_output, read_marker
from plasticlm.runs import RunDir, write_text_atomic
from plasticlm.sandbox import shipped

TINY = ["--vocab-size", "16", "--hidden-size", "8", "--num-layers", "1", "--num-heads", "2"]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(folder.rglob("*"))}


def users_folder(folder: Path, name: str = "notes.txt") -> dict[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("years of work\n")
    (folder / "config.json").write_text('{"mine": true}\n')
    return snapshot(folder)


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    status = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [x for x in err.strip().splitlines() if x.startswith("plasticlm: ")]
    return status, lines[-1] if lines else ""


@pytest.mark.parametrize("home", ["parent", "itself"])
def test_a_folder_in_the_cache_home_is_not_plasticlms_for_being_there(home, tmp_path, capsys,
                                                                        monkeypatch):
    proj = tmp_path / "proj"
    before = users_folder(proj)
    monkeypatch.setenv("PLASTICLM_HOME", str(tmp_path if home == "parent" else proj))
    status, line = run_cli(["models", "build-tiny", "llama", str(proj), *TINY], capsys)
    assert status == 2 and "not written by plasticlm" in line, line
    assert snapshot(proj) == before


def marked_run(folder: Path) -> None:
    """A finished FedNL run folder, as plasticlm leaves one."""
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"kind": "run"}) + "\n")
    (folder / "config.json").write_text('{"name": "run"}\n')
    (folder / "round_0001").mkdir()
    (folder / "round_0001" / "theta.safetensors").write_bytes(b"theta" * 50)
    (folder / "checkpoint.json").write_text('{"round": 1}\n')


def test_a_marker_covers_only_the_names_plasticlm_creates(tmp_path, capsys):
    run = tmp_path / "proj"
    marked_run(run)
    newdata = run / "newdata"
    before = users_folder(newdata, "results.csv")
    status, line = run_cli(["models", "build-tiny", "llama", str(newdata), *TINY], capsys)
    assert status == 2 and "not written by plasticlm" in line, line
    assert snapshot(newdata) == before
    # a new run in the marked folder clears what plasticlm wrote, never the user's subfolder
    # nor a file of a name plasticlm never writes (found by review: analysis.csv was cleared)
    (run / "analysis.csv").write_text("mine")
    prepare_output(run, "run", fresh=True)
    assert sorted(p.name for p in run.iterdir()) == [MARKER, "analysis.csv", "newdata"]
    assert snapshot(newdata) == before and (run / "analysis.csv").read_text() == "mine"
    # a model folder replaced whole keeps the user's subfolder too
    model = tmp_path / "model"
    with atomic_output(model, "model") as tmp:
        (tmp / "config.json").write_text("{}")
    mine = users_folder(model / "mine")
    (model / "eval.csv").write_text("mine")
    with atomic_output(model, "model") as tmp:
        (tmp / "config.json").write_text('{"v": 2}')
    assert snapshot(model / "mine") == mine and (model / "config.json").read_text() == '{"v": 2}'
    assert (model / "eval.csv").read_text() == "mine"
    assert read_marker(model)["kept"] == ["eval.csv", "mine"]


def test_a_marked_folder_of_another_kind_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    marked_run(run)
    before = snapshot(run)
    status, line = run_cli(["models", "build-tiny", "llama", str(run), *TINY], capsys)
    assert status == 2 and "holds plasticlm's run files, not a model" in line, line
    assert snapshot(run) == before
    with pytest.raises(PlasticError, match="not a fuser"):
        prepare_output(run, "fuser", fresh=True)
    assert snapshot(run) == before
    RunDir(run, kind="experiment")   # an experiment folder holds its run's files, and back


def fake_family(root: Path, preset: str = "fake") -> Path:
    """A small shipped family in a package folder of the test's own."""
    src = root / preset
    files = {"receiver/config.json": b'{"model_type": "llama"}', "receiver/model.safetensors":
             b"w" * 64, "world/world.json": b"{}", "report.json": b"{}"}
    manifest = {"member_keys": {}, "files": {}}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
        manifest["files"][rel] = {"sha256": shipped.sha256(src / rel), "bytes": len(data)}
    (src / shipped.MANIFEST).write_text(json.dumps(manifest))
    return src


@pytest.fixture
def family(tmp_path, monkeypatch):
    """(the cache home, where the fake family installs, the user's model folder)."""
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", tmp_path / "package")
    fake_family(tmp_path / "package")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PLASTICLM_HOME", str(home))
    return home, home / "models" / "fake-v2", tmp_path / "user" / "model"


def test_the_installer_marks_what_it_creates_and_installs_again(family):
    home, dest, _ = family
    assert shipped.install_shipped("fake", dest)
    assert read_marker(dest)["kind"] == "model" and read_marker(dest / "receiver")["kind"] == \
        "model" and read_marker(dest / "world")["kind"] == "data"
    assert shipped.install_shipped("fake", dest)   # a stale family installs over its own


@pytest.mark.parametrize("link", ["member", "models", "file"])
def test_the_installer_never_writes_through_a_symbolic_link(link, family):
    home, dest, user = family
    before = users_folder(user)
    if link == "member":    # an installed member's folder is now a link to the user's model
        shipped.install_shipped("fake", dest)
        (dest / "receiver").rename(dest / "old")
        (dest / "receiver").symlink_to(user)
    elif link == "models":  # the cache's models/ is a link to the user's folder
        (home / "models").symlink_to(user.parent)
    else:                   # an installed family whose config.json is a link to the user's
        shipped.install_shipped("fake", dest)
        (dest / "receiver" / "config.json").unlink()
        (dest / "receiver" / "config.json").symlink_to(user / "config.json")
    with pytest.raises(PlasticError, match="symbolic link"):
        shipped.install_shipped("fake", dest)
    assert snapshot(user) == before


def test_no_marker_metrics_or_atomic_write_follows_a_planted_link(tmp_path):
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("mine")
    run = RunDir(tmp_path / "run")
    for name in ("metrics.jsonl", "summary.json.partial", MARKER + ".partial"):
        (run.path / name).symlink_to(theirs)
    with pytest.raises(PlasticError, match="symbolic link"):
        run.log(step=1)
    with pytest.raises(PlasticError, match="symbolic link"):
        write_text_atomic(run.path / "summary.json", "{}")
    with pytest.raises(PlasticError, match="symbolic link"):
        write_text(run.path / (MARKER + ".partial"), "{}")
    assert theirs.read_text() == "mine"


@pytest.mark.parametrize("value, message", [
    (".", "relative path"), ("cache", "relative path"), ("/", "your home folder"),
    ("HOME", "your home folder"), ("FILE", "not a folder"), ("a\0b", "NUL"),
    ("SHARED", "only you may write to")])
def test_a_cache_home_that_would_hold_the_users_files_is_refused(value, message, tmp_path,
                                                                  monkeypatch):
    (tmp_path / "file").write_text("mine")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared").chmod(0o1777)     # like /tmp: another user could plant models there
    value = {"HOME": os.path.expanduser("~"), "FILE": str(tmp_path / "file"),
             "SHARED": str(tmp_path / "shared")}.get(value, value)
    if "\0" in value:   # the environment cannot carry a NUL: the check sees it as read
        monkeypatch.setattr(os, "environ", {**os.environ, "PLASTICLM_HOME": value})
    else:
        monkeypatch.setenv("PLASTICLM_HOME", value)
    with pytest.raises(PlasticError, match=message):
        cache_root()
    monkeypatch.setenv("PLASTICLM_HOME", "~/plasticlm-cache")   # expanded, never a './~'
    assert cache_root() == Path.home() / "plasticlm-cache"
