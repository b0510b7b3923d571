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
