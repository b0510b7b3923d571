"""Bad input as a class: every option of every command, read from the CLI's own parser, given
wrong types, out-of-range numbers (0, -1, NaN, inf, 1e309, huge integers), missing, garbage
and empty files and folders, and user folders as outputs. Each must end with a non-zero exit,
one line on stderr, no traceback, nothing written (in the working folder, the output path or
the folders given) and within 20 s. A fixed seeded sample plus a few hypothesis examples keep
the run short; ``ACCEPTED`` lists the values that are valid for their option."""

import argparse
import math
import os
import random
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bad_commands import FOLDER, GARBAGE, MODEL, NOPE, OUT, SECONDS, TEXT, inputs  # noqa: F401

from plasticlm.cli import build_parser, main

USER = "USER"        # a folder of the user's (not empty, no plasticlm marker)
RUN = "RUN"          # a finished run folder with a table (what `report` reads)
# cases of the fixed sample (seeded); PLASTICLM_FUZZ_ALL=1 tries every case
SAMPLE = 10**6 if os.environ.get("PLASTICLM_FUZZ_ALL") else 300
# A valid command line for each command; positionals first (the fuzz replaces one of them).
BASE = {
    "demo": ["--quick", "--out", OUT],
    "models pretrain": ["--text", TEXT, "--out", OUT],
    "models import-llama2c": [NOPE, NOPE, OUT],
    "models info": [MODEL], "models generate": [MODEL], "models build-tiny": ["llama", OUT],
    "data world": ["--out", OUT], "data niah": ["--out", OUT], "data inspect": [TEXT],
    "memory mqar": ["--out", OUT], "memory info": [FOLDER],
    "fednl run": ["--quick", "--set", f"outputs.out={OUT}"],
    "fednl compare": ["--quick", "--set", f"outputs.out={OUT}"],
    "fednl experiment": ["niah", "--quick", "--set", f"out={OUT}"],
    "fednl submit": ["fuzz"],     # a connection to a closed port (flower_home below)
    "refine train-fuser": ["--receiver", MODEL, "--transmitter", MODEL, "--out", OUT],
    "refine pretrain-fuser": ["--receiver", MODEL, "--transmitter", MODEL, "--registry", OUT],
    "refine ask": ["hi", "--receiver", MODEL], "refine serve": ["--model", MODEL],
    "refine registry": ["--folder", FOLDER],
    "refine experiment": ["transfer", "--quick", "--set", f"out={OUT}"],
    "scol train": ["--quick", "--out", OUT],
    "scol run": ["--quick", "--policy", MODEL, "--out", OUT],
    "scol experiment": ["squad", "--quick", "--out", OUT],
    "report": [RUN], "bench": ["--quick", "--out", OUT],
}
INPUT_PATHS = {"config", "text", "model", "receiver", "transmitter", "fuser", "reverse_fuser",
               "policy", "mmlu", "corpus", "haystack", "tokenizer", "tls_cert", "tls_key", "ca",
               "model_bin", "tokenizer_bin", "adapter_dir", "path", "run_dir", "folder",
               "registry", "sweep", "app"}
OUTPUT_PATHS = {"out", "out_dir", "tensorboard"}
INTS = ["abc", "1.5", "", "nan", "1e309", "0", "-1", str(10**30)]
FLOATS = ["abc", "", "nan", "inf", "-inf", "1e309", "-1"]
PATHS = [NOPE, GARBAGE, FOLDER, ""]
OUTPUTS = [GARBAGE, USER, ""]
TEXTS = ["", "nope", "-x"]
SETS = ["nope=1", "=", "", "seed=nan", "seed=1e309", f"seed={10**30}", "seed=-1"]
# Values that are valid for the option (command, dest): not bad input, so not tried.
ACCEPTED = {
    ("*", "seed", "0"), ("*", "temperature", "0"), ("*", "port", "0"),
    *(("*", "prompt", v) for v in TEXTS),          # any text is a prompt
    ("report", "tensorboard", ""),                  # the default LOGDIR, RUN/tensorboard
    ("refine serve", "registry", FOLDER),           # a registry with no fuser yet
}


def _leaves(parser: argparse.ArgumentParser, prefix=()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(prefix), parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, (*prefix, name))


def _values(action: argparse.Action) -> list[str]:
    """The bad values of one option, by what the parser says it takes."""
    dest = action.dest
    if dest == "overrides":
        return SETS
    if action.choices is not None and not isinstance(action.choices, dict):
        return ["nope", ""]
    if action.type is int or getattr(action.type, "__name__", "") == "int":
        return INTS
    if action.type is float:
        return FLOATS
    if dest in OUTPUT_PATHS:
        return OUTPUTS
    if dest in INPUT_PATHS:
        return PATHS
    if dest == "device":
        return ["quantum", "cuda:99", ""]
    return TEXTS


def all_cases() -> list[tuple[str, str, str]]:
    """(command, option or positional index, value) over every option of every command."""
    cases = []
    for command, parser in _leaves(build_parser()):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._StoreTrueAction,
                                   argparse._StoreConstAction)) or action.nargs == 0:
                continue
            where = action.option_strings[0] if action.option_strings else \
                str([a for a in parser._actions if not a.option_strings].index(action))
            for value in _values(action):
                if value == action.default or argv_of(command, where, value) == \
                        [*command.split(), *BASE[command]]:   # the default or the base value
                    continue
                if not ({("*", action.dest, value), (command, action.dest, value)} & ACCEPTED):
                    cases.append((command, where, value))
    return cases


def argv_of(command: str, where: str, value: str) -> list[str]:
    base = list(BASE[command])
    if where.isdigit():
        base[int(where)] = value
        return [*command.split(), *base]
    if where in base and where != "--set":   # the option replaces its base value
        i = base.index(where)
        del base[i: i + 2]
    return [*command.split(), *base, where, value]


CASES = all_cases()
SAMPLED = random.Random(38).sample(CASES, min(SAMPLE, len(CASES)))


def _never_serve(*args, **kwargs):
    raise AssertionError("the bad input was accepted: the service was about to start")


@pytest.fixture(scope="module", autouse=True)
def no_service():
    """An accepted `refine serve` / `registry` case fails at once instead of serving forever
    (the alarm cannot always interrupt a running event loop)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("plasticlm.refine.wire.serving.serve", _never_serve)
        yield


@pytest.fixture(scope="module", autouse=True)
def flower_home(tmp_path_factory):
    """Flower's CLI (`fednl submit`) reads its connections from FLWR_HOME, never the user's
    ~/.flwr: one named "fuzz" to a closed loopback port (Flower's default "local" would start
    a SuperLink)."""
    home = tmp_path_factory.mktemp("flwr_home")
    (home / "config.toml").write_text('[superlink]\ndefault = "fuzz"\n\n[superlink.fuzz]\n'
                                      'address = "127.0.0.1:9"\ninsecure = true\n')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLWR_HOME", str(home))
        yield


@pytest.fixture(scope="module")
def names(inputs, tmp_path_factory):  # noqa: F811 (the fixture of test_bad_commands)
    root = tmp_path_factory.mktemp("fuzz")
    (root / "user").mkdir()
    (root / "user" / "thesis.tex").write_text("years of work")
    (root / "run").mkdir()
    (root / "run" / "table.md").write_text("| a |\n|---|\n| 1 |\n")
    return {**inputs, USER: str(root / "user"), RUN: str(root / "run")}


def _tree(*folders: str) -> list:
    return [sorted((str(p), p.stat().st_size) for p in Path(f).rglob("*")) for f in folders]


def _timeout(signum, frame):
    raise TimeoutError(f"still running after {SECONDS}s: the bad input was accepted")


def refused(argv: list[str], names: dict, tmp_path: Path, capsys) -> None:
    """Run ``argv`` in-process in an empty working folder; assert the clean refusal."""
    out = tmp_path / "out"
    filled = {**names, OUT: str(out)}
    argv = [filled.get(a, a.replace(OUT, str(out)) if "=" in a and OUT in a else a)
            for a in argv]
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    before = _tree(names[FOLDER], names[USER], names[RUN])
    old = os.getcwd()
    os.chdir(cwd)
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(SECONDS)
    try:
        status = main(argv)
    except SystemExit as e:          # argparse: usage and one error line
        status = e.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(old)
    err = capsys.readouterr().err
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert status not in (0, None), f"exit {status}: {argv}\n{err}"
    assert "Traceback" not in err, err
    assert lines and (lines[-1].startswith("plasticlm: ") or ": error: " in lines[-1]), err
    assert len([x for x in lines if x.startswith("plasticlm: ")]) <= 1, err
    assert not out.exists(), f"{out} was written"
    assert not any(cwd.iterdir()), f"left in the working folder: {list(cwd.iterdir())}"
    assert _tree(names[FOLDER], names[USER], names[RUN]) == before, "a folder given was written"


@pytest.mark.parametrize("case", SAMPLED, ids=[" ".join(c)[:70] for c in SAMPLED])
def test_every_option_refuses_bad_values_cleanly(case, names, tmp_path, capsys):
    refused(argv_of(*case), names, tmp_path, capsys)


NUMERIC = [(c, a.option_strings[0], float if a.type is float else int)
           for c, p in _leaves(build_parser()) for a in p._actions
           if a.option_strings and (a.type is float or getattr(a.type, "__name__", "") == "int")
           and a.dest not in {"seed", "port", "temperature"}]


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(option=st.sampled_from(NUMERIC), data=st.data())
def test_numeric_options_refuse_out_of_range_numbers(option, data, names, tmp_path, capsys):
    command, flag, kind = option
    if kind is int:
        value = data.draw(st.integers(max_value=0) | st.integers(min_value=10**15))
    else:
        value = data.draw(st.sampled_from([math.nan, math.inf, -math.inf])
                          | st.floats(max_value=0, allow_nan=False, allow_infinity=False))
    refused(argv_of(command, flag, repr(value) if kind is float else str(value)), names,
            tmp_path, capsys)
