"""One line, never a traceback (issue 56, item 5): each input the attacker's and the careless
user's runs found to end in a traceback, or to be accepted, is refused with exit 2 and one
``plasticlm: error:`` line of bounded length naming the problem; nothing is written."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from plasticlm.cli import main
from plasticlm.config_files import read_config_file
from plasticlm.errors import PlasticError
from plasticlm.home import cache_home
from plasticlm.refine.wire.codec import PayloadError, read_metadata
from plasticlm.refine.wire.serving import check_token
from plasticlm.sandbox import preset_dir
from plasticlm.scol.checkpoint import check_resumable

SECONDS = 60   # accepted input would train: stopped here, and the case fails
BUSY = "BUSY_PORT"   # a port the test holds: a service that accepted its input cannot serve
LONG = "n" * 300
DEEP = "[" * 100_000 + "]" * 100_000


def _deep_safetensors(in_value: bool = True) -> bytes:
    """A safetensors file whose metadata value is JSON nested 100,000 deep (a valid file),
    or whose header itself is (``in_value=False``)."""
    tensor = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    header = json.dumps({"__metadata__": {"plasticlm": DEEP}, "a": tensor}).encode() \
        if in_value else (json.dumps({"a": tensor})[:-1] + f', "z": {DEEP}}}').encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + b"\0" * 4


def _run_folder(root: Path) -> Path:
    """A FedNL run with a committed round whose config.json was deleted."""
    run = root / "runs" / "r"
    (run / "round_0001").mkdir(parents=True)
    (run / ".plasticlm").write_text('{"kind": "run"}\n')
    (run / "checkpoint.json").write_text('{"round": 1}\n')
    return run


def write_inputs(tmp: Path) -> None:
    """The bad files and folders the cases name, under ``tmp``."""
    files = {"nan.json": '{"train": {"lr": NaN}}', "nan-name.json": '{"name": NaN}',
             "nul.json": '{"name": "a\\u0000b"}', "dup.json": '{"name": "a", "name": "b"}',
             "dup.yaml": "name: a\nname: b\n", "dup.toml": 'name = "a"\nname = "b"\n',
             "laughs.yaml": "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
                 f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n"
                 for p, c in zip("abcdefgh", "bcdefghi")),
             "deep.json": DEEP}
    for name, text in files.items():
        (tmp / name).write_text(text)
    for name, rope in (("rope-nan", "NaN"), ("rope-inf", "1e999"), ("rope-neg", "-2.0")):
        (tmp / name).mkdir()
        (tmp / name / "config.json").write_text(
            '{"model_type": "llama", "rope_parameters": {"rope_type": "linear", "factor": '
            f'{rope}, "rope_theta": 10000.0}}}}')
    (tmp / "adapter").mkdir()
    (tmp / "adapter" / "memory_config.json").write_text("{}")
    (tmp / "adapter" / "memory_theta.safetensors").write_bytes(_deep_safetensors(False))
    (tmp / "afile").write_text("mine")
    family = preset_dir("quick").relative_to(cache_home())   # models/sandbox-quick-vN
    (tmp / "bad-home" / family).mkdir(parents=True)
    (tmp / "bad-home" / family / "manifest.json").write_text("garbage{")
    (tmp / "evil-home" / family).mkdir(parents=True)
    (tmp / "evil-home" / family / "manifest.json").write_text(json.dumps(
        {"files": {"../../../escape": {"sha256": "0" * 64, "bytes": 1}}}))
    _run_folder(tmp)


def cases(tmp: Path) -> dict[str, tuple[list[str], dict, str]]:
    """name -> (argv, environment, what the line must say), for inputs under ``tmp``."""
    bad_home, evil_home, run = tmp / "bad-home", tmp / "evil-home", tmp / "runs" / "r"
    fednl = ["fednl", "run", "--quick", "--set", f"outputs.out={tmp / 'out'}"]
    quick = ["models", "info", "quick:receiver"]
    return {
        "300-char name": (fednl + ["--set", f"name={LONG}"], {}, "must be a folder name"),
        "NUL in name": (fednl + ["--config", str(tmp / "nul.json")], {}, "control character"),
        "outputs.out=/proc/self": (["fednl", "run", "--quick", "--set", "outputs.out=/proc/self"],
                                   {}, "cannot create the output folder /proc/self"),
        "PLASTICLM_HOME a file": (quick, {"PLASTICLM_HOME": str(tmp / "afile")}, "not a folder"),
        "PLASTICLM_HOME relative": (quick, {"PLASTICLM_HOME": "."}, "relative path"),
        "PLASTICLM_HOME /": (quick, {"PLASTICLM_HOME": "/"}, "your home folder"),
        "garbage manifest.json": (quick, {"PLASTICLM_HOME": str(bad_home)}, "is unreadable"),
        "manifest naming ../": (quick, {"PLASTICLM_HOME": str(evil_home)}, "is malformed"),
        "nested safetensors metadata": (["memory", "info", str(tmp / "adapter")], {},
                                        "not a readable safetensors file"),
        "100,000-char model name": (["models", "info", "x" * 100_000], {},
                                    "neither a folder nor a hub id"),
        "100,000-char sandbox name": (["models", "info", "quick:" + "x" * 100_000], {},
                                      "no sandbox model"),
        "NaN in a JSON config": (fednl + ["--config", str(tmp / "nan.json")], {},
                                 "NaN is not a number"),
        "NaN for a name": (fednl + ["--config", str(tmp / "nan-name.json")], {},
                           "NaN is not a number"),
        "JSON nested 100,000 deep": (fednl + ["--config", str(tmp / "deep.json")], {},
                                     "nested too deeply"),
        "YAML billion laughs": (fednl + ["--config", str(tmp / "laughs.yaml")], {},
                                "anchors and aliases are not accepted"),
        "rope_scaling NaN": (["models", "info", str(tmp / "rope-nan")], {}, "NaN is not"),
        "rope_scaling infinite": (["models", "info", str(tmp / "rope-inf")], {},
                                  "factor is inf, not a finite number > 0"),
        "rope_scaling negative": (["models", "info", str(tmp / "rope-neg")], {},
                                  "factor is -2.0, not a finite number > 0"),
        "token of 16 spaces": (["refine", "registry", "--folder", str(tmp / "adapter"),
                                "--port", BUSY], {"PLASTICLM_TOKEN": " " * 16},
                               "spaces or control characters"),
        "duplicate JSON key": (fednl + ["--config", str(tmp / "dup.json")], {}, "given twice"),
        "duplicate YAML key": (fednl + ["--config", str(tmp / "dup.yaml")], {}, "given twice"),
        "duplicate TOML key": (fednl + ["--config", str(tmp / "dup.toml")], {},
                               "Cannot overwrite"),
        "--resume without config.json": (["fednl", "run", "--quick", "--resume", "--set",
                                          f"outputs.out={run.parent}", "--set", "name=r"],
                                         {}, "holds rounds but no config.json"),
    }


NAMES = list(cases(Path("/nonexistent")))


def _timeout(signum, frame):
    raise TimeoutError(f"still running after {SECONDS} s: the bad input was accepted")


@pytest.mark.parametrize("name", NAMES)
def test_each_case_is_one_line_and_writes_nothing(name, tmp_path, capsys, monkeypatch):
    write_inputs(tmp_path)
    argv, env, expected = cases(tmp_path)[name]
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    argv = [str(busy.getsockname()[1]) if a == BUSY else a for a in argv]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    before = sorted(tmp_path.rglob("*"))
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(SECONDS)
    try:
        status = main(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        busy.close()
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [x for x in err.strip().splitlines() if x.startswith("plasticlm: ")]
    assert status == 2 and len(lines) == 1 and lines[0] == err.strip().splitlines()[-1], err
    assert lines[0].startswith("plasticlm: error: ") and expected in lines[0], lines[0]
    assert len(lines[0]) < 2_100, len(lines[0])
    assert sorted(tmp_path.rglob("*")) == before, "something was written"


def test_yaml_aliases_are_refused_before_any_expansion_and_json_nesting_is_bounded(tmp_path):
    write_inputs(tmp_path)
    with pytest.raises(PlasticError, match="line 1"):   # the first anchor, not the expansion
        read_config_file(tmp_path / "laughs.yaml")
    with pytest.raises(PayloadError, match="no valid 'plasticlm' entry"):
        read_metadata(_deep_safetensors(), "plasticlm")


def test_a_blank_token_is_refused_wherever_it_is_checked():
    for token in (" " * 16, "\t" * 20, "abcdefgh ijklmnop", "a" * 15 + "\n"):
        with pytest.raises(PlasticError, match="spaces or control characters"):
            check_token(token, "127.0.0.1")
    check_token("a" * 32, "127.0.0.1")


def test_scol_resume_refuses_a_missing_or_damaged_config(tmp_path):
    with pytest.raises(PlasticError, match="is missing"):
        check_resumable(tmp_path / "config.json", None)
    (tmp_path / "config.json").write_text('{"a": 1, "a": 2}')
    with pytest.raises(PlasticError, match="not readable JSON"):
        check_resumable(tmp_path / "config.json", None)


def _as_nobody() -> list[str]:
    """The command prefix that runs as a user without write access (root writes anywhere)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


def test_read_only_output_folders_and_home_are_one_line():
    """Run as another user when this is root (chmod binds no root), in a folder it may read."""
    root = Path(tempfile.mkdtemp(prefix="plasticlm-ro-"))
    try:
        os.chmod(root, 0o755)
        (root / "ro").mkdir(mode=0o555)
        (root / "home").mkdir(mode=0o555)
        os.chmod(root / "ro", 0o555)
        os.chmod(root / "home", 0o555)
        if _as_nobody():   # the home must be the user's own (plasticlm.home), read-only
            os.chown(root / "home", 65534, 65534)
        env = {**os.environ, "PLASTICLM_HOME": str(root / "home"), "PLASTICLM_THREADS": "1"}
        tiny = ["--vocab-size", "16", "--hidden-size", "8", "--num-layers", "1",
                "--num-heads", "2"]
        commands = [["models", "build-tiny", "llama", str(root / "ro" / "m"), *tiny],
                    ["models", "info", "quick:receiver"]]
        runs = [subprocess.Popen([*_as_nobody(), sys.executable, "-m", "plasticlm.cli", *c],
                                 env=env, cwd=root, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for c in commands]
        for run, expected in zip(runs, ("cannot create the output folder", "Permission denied")):
            _, err = run.communicate(timeout=120)
            assert "Traceback" not in err, err
            last = err.strip().splitlines()[-1]
            assert run.returncode == 2 and last.startswith("plasticlm: error: ") and \
                expected in last, err
        assert not any((root / "ro").iterdir()) and not any((root / "home").iterdir())
    finally:
        for folder in (root / "ro", root / "home"):
            if folder.exists():
                os.chmod(folder, 0o755)
        shutil.rmtree(root)
