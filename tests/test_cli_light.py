"""The command line's parser builds without torch, transformers, peft or Flower: `--help` and
a mistyped option answer at once, and each command loads its heavy modules when it runs."""

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "flwr", "peft")
PROBE = f"""
import json, sys, time
start = time.perf_counter()
from plasticlm.cli import build_parser
build_parser()
print(json.dumps({{"seconds": time.perf_counter() - start,
                  "heavy": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
"""


def test_parser_builds_without_heavy_imports():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, timeout=60)
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["heavy"] == [], f"building the parser imported {result['heavy']}"
    assert result["seconds"] < 2, f"building the parser took {result['seconds']:.2f} s"


ANSWER = f"""
import contextlib, io, json, sys, time
start = time.perf_counter()
from plasticlm.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps({{"seconds": time.perf_counter() - start, "text": out.getvalue(),
                  "heavy": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
"""


def _answer(*argv: str) -> dict:
    out = subprocess.run([sys.executable, "-c", ANSWER, *argv], capture_output=True,
                         text=True, check=True, timeout=60)
    return json.loads(out.stdout.splitlines()[-1])


def test_version_and_help_answer_without_heavy_imports():
    """`--version` and `--help` exit while parsing, before the command's heavy imports (the
    issue's targets, 0.5 s and 1 s on 2 cores, measured ~0.2 s; the bound here is generous
    because CI machines are shared)."""
    version = _answer("--version")
    assert version["text"].startswith("plasticlm "), version["text"]
    assert "torch " in version["text"]   # versions read from package metadata, not imports
    for result in (version, _answer("--help"), _answer("fednl", "--help")):
        assert result["heavy"] == [], f"answering imported {result['heavy']}"
        assert result["seconds"] < 2, f"answering took {result['seconds']:.2f} s"
