"""Outputs that never destroy: a Hugging Face model folder (``config.json`` and weights) given
as the output of every writing command is left byte for byte, with one line and a non-zero
exit; ``plasticlm report`` writes into its own marked folder; ``--overwrite`` only adds."""

import json
import signal
from pathlib import Path

import pytest

from plasticlm.cli import main
from plasticlm.errors import PlasticError
from plasticlm.outputs import MARKER, atomic_output, overwrite_allowed, prepare_output, read_marker
from plasticlm.runs import clear_run_folder

HF = "HF"            # the user's model folder, given as the output
PARENT = "PARENT"    # the folder holding it (for outputs named by out=... and name=...)
NOPE = "/nonexistent/plasticlm-model"   # refused before any model is read
REFUSAL = "not written by plasticlm"

# (argv, name of the HF folder inside PARENT): each names HF as the folder it writes
WRITERS = [
    (["demo", "--quick", "--out", HF], "hf"),
    (["models", "build-tiny", "llama", HF], "hf"),
    (["models", "import-llama2c", NOPE, NOPE, HF], "hf"),
    (["models", "pretrain", "--text", NOPE, "--out", HF], "hf"),
    (["models", "pretrain", "--preset", "quick", "--out", HF], "hf"),
    (["data", "world", "--out", HF], "hf"),
    (["data", "niah", "--out", HF], "hf"),
    (["memory", "mqar", "--out", HF], "hf"),
    (["fednl", "run", "--quick", "--set", f"outputs.out={PARENT}", "--set", "name=hf"], "hf"),
    (["fednl", "compare", "--quick", "--methods", "fednl", "--set", f"outputs.out={PARENT}",
      "--set", "name=hf"], "hf-fednl"),
    (["fednl", "experiment", "niah", "--quick", "--set", f"out={PARENT}"], "niah"),
    (["refine", "train-fuser", "--receiver", NOPE, "--transmitter", NOPE, "--out", HF], "hf"),
    (["refine", "pretrain-fuser", "--receiver", NOPE, "--transmitter", NOPE, "--registry", HF],
     "hf"),
    (["refine", "experiment", "transfer", "--quick", "--set", f"out={HF}"], "hf"),
    (["refine", "experiment", "modes", "--set", "receiver=quick:receiver", "--set",
      f"out={HF}"], "hf"),
    (["scol", "train", "--quick", "--out", HF], "hf"),
    (["scol", "run", "--quick", "--policy", NOPE, "--out", HF], "hf"),
    (["scol", "experiment", "squad", "--quick", "--out", HF], "hf"),
    (["bench", "--quick", "--out", HF], "hf"),
    (["report", PARENT, "--tensorboard", HF], "hf"),
]


def _hf_folder(folder: Path) -> dict[str, bytes]:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 9}))
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    (folder / "tokenizer.json").write_text("{}")
    return _snapshot(folder)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(folder.rglob("*"))}


def _timeout(signum, frame):
    raise TimeoutError("still running after 20 s: the output folder was accepted")


def _run(argv: list[str], capsys) -> tuple[int, list[str]]:
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(20)
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    # progress logs may come first; the refusal is one line, the last
    lines = [x for x in err.strip().splitlines() if x.strip()]
    ours = [x for x in lines if x.startswith("plasticlm: ")]
    assert len(ours) <= 1 and (not ours or lines[-1] == ours[0]), err
    return status, ours


@pytest.mark.parametrize("argv,name", WRITERS, ids=[" ".join(a[:3]) for a, _ in WRITERS])
def test_a_model_folder_given_as_output_is_left_byte_for_byte(argv, name, tmp_path, capsys,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    parent = tmp_path / "parent"
    hf = parent / name
    before = _hf_folder(hf)
    (parent / "metrics.jsonl").write_text('{"time": 1.0, "loss": 2.0}\n')   # for report
    argv = [a.replace(PARENT, str(parent)).replace(HF, str(hf)) for a in argv]
    status, lines = _run(argv, capsys)
    assert status not in (0, None), lines
    assert len(lines) == 1, lines
    assert "exists" in lines[0] if argv[:2] == ["data", "niah"] else REFUSAL in lines[0], lines
    assert _snapshot(hf) == before, f"{hf} was changed"


def test_report_writes_its_own_folder_beside_the_users_index(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"lr": 0.1}')
    (run / "table.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    (run / "index.md").write_text("my own notes\n")
    (run / "index.html").write_text("<p>my page</p>")
    status, lines = _run(["report", str(run)], capsys)
    assert status == 0, lines
    assert (run / "index.md").read_text() == "my own notes\n"
    assert (run / "index.html").read_text() == "<p>my page</p>"
    assert "<h3>Table</h3>" in (run / "report" / "index.html").read_text()   # the run's table
    assert read_marker(run / "report")["kind"] == "report"
    # again: the report's own folder is replaced, the run is not reported twice
    assert _run(["report", str(run)], capsys)[0] == 0
    assert (run / "report" / "index.html").read_text().count("<section") == 1


def test_report_refuses_a_report_folder_it_did_not_write(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "table.md").write_text("| a |\n|---|\n| 1 |\n")
    before = _hf_folder(run / "report")
    status, lines = _run(["report", str(run)], capsys)
    assert status == 2 and len(lines) == 1 and REFUSAL in lines[0], lines
    assert _snapshot(run / "report") == before


def test_overwrite_adds_files_and_never_replaces_or_removes(tmp_path, capsys):
    tiny = ["--vocab-size", "16", "--hidden-size", "8", "--num-layers", "1", "--num-heads", "2"]
    hf = tmp_path / "hf"
    before = _hf_folder(hf)
    status, lines = _run(["models", "build-tiny", "llama", str(hf), "--overwrite", *tiny], capsys)
    assert status == 2 and "--overwrite would replace" in lines[0] and _snapshot(hf) == before
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("years of work")
    status, lines = _run(["models", "build-tiny", "llama", str(theirs), *tiny], capsys)
    assert status == 2 and REFUSAL in lines[0] and "--overwrite" in lines[0]
    assert sorted(p.name for p in theirs.iterdir()) == ["thesis.tex"]
    for _ in range(2):   # added to, then replaced as plasticlm's own: thesis.tex stays
        status, lines = _run(["models", "build-tiny", "llama", str(theirs), "--overwrite",
                              *tiny], capsys)
        assert status == 0, lines
        assert (theirs / "thesis.tex").read_text() == "years of work"
        assert (theirs / "config.json").is_file() and read_marker(theirs)["kept"] == ["thesis.tex"]
    with overwrite_allowed(False):   # marked now: a clear removes only what plasticlm wrote
        prepare_output(theirs, "model", fresh=True)
    assert sorted(p.name for p in theirs.iterdir()) == [MARKER, "thesis.tex"]


def test_an_older_run_folder_is_accepted_once_and_marked(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text("{}")
    (old / "metrics.jsonl").write_text('{"time": 1}\n')
    clear_run_folder(old, "")
    assert [p.name for p in old.iterdir()] == [MARKER] and read_marker(old)["kind"] == "run"
    hf = tmp_path / "hf"
    before = _hf_folder(hf)
    with pytest.raises(PlasticError, match=REFUSAL):
        clear_run_folder(hf, "")
    assert _snapshot(hf) == before


def test_a_users_partial_folder_and_files_are_never_removed(tmp_path):
    theirs = tmp_path / "out.partial"
    theirs.mkdir()
    (theirs / "draft.txt").write_text("mine")
    with pytest.raises(PlasticError, match="out.partial exists and was not written"):
        with atomic_output(tmp_path / "out", "model"):
            pass
    assert (theirs / "draft.txt").read_text() == "mine"
    (tmp_path / "file").write_text("mine")
    with pytest.raises(PlasticError, match="not a folder"):
        prepare_output(tmp_path / "file", "run")
    with pytest.raises(RuntimeError):   # a failed write leaves nothing behind
        with atomic_output(tmp_path / "new", "model") as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("disk full")
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.partial").exists()
