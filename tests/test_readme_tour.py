"""The README's and docs/getting-started.md's commands run as written (issue 42, item 7).

Every fenced ``bash`` and ``python`` block of the two pages is extracted. ``plasticlm`` command
lines on the sandbox run as a new user would type them (with ``--quick`` where the command
offers it), in a fresh folder with a fresh ``PLASTICLM_HOME``; the Python tour runs after
them. Lines that name a hub checkpoint or a GPU cannot run on a machine without the hub or a
GPU: each is parsed by the command line's own parser instead (every option and value
valid). ``make`` lines are what CI runs itself.
"""

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from plasticlm.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", ROOT / "docs" / "getting-started.md")
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.S | re.M)
NEEDS_HUB_OR_GPU = re.compile(r"\b(Qwen|meta-llama)/|--device cuda|/models/")


def blocks(lang: str) -> list[tuple[str, str]]:
    return [(page.name, body) for page in PAGES for kind, body in BLOCK.findall(page.read_text())
            if kind == lang]


def command_lines(body: str) -> list[str]:
    """The shell lines of a block, continuations joined, comments and blanks dropped."""
    lines = body.replace("\\\n", " ").splitlines()
    return [re.sub(r"\s+#.*$", "", line).strip() for line in lines
            if line.strip() and not line.strip().startswith("#")]


def tour_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page, body in blocks("bash"):
        for line in command_lines(body):
            words = shlex.split(line)
            if words[0] == "plasticlm":
                found.append((page, words))
            else:
                assert words[0] in ("make", "python", "flwr", "flower-superlink",
                                    "flower-supernode"), f"{page}: unexpected command {line!r}"
    return found


def offers_quick(words: list[str]) -> bool:
    parser, rest = build_parser(), words[1:]
    try:
        with contextlib.redirect_stderr(io.StringIO()):   # the parser's refusal is the answer
            parser.parse_args([*rest, "--quick"])
    except SystemExit:
        return False
    return True


def test_the_pages_have_a_tour():
    assert blocks("python"), "the README has no Python tour"
    assert any(not NEEDS_HUB_OR_GPU.search(" ".join(w)) for _, w in tour_commands())


def test_commands_for_real_checkpoints_are_valid_command_lines():
    parser = build_parser()
    real = [(page, w) for page, w in tour_commands() if NEEDS_HUB_OR_GPU.search(" ".join(w))]
    assert real
    for page, words in real:
        try:
            parser.parse_args(words[1:])
        except SystemExit:
            pytest.fail(f"{page}: {' '.join(words)} is not a valid command line")


@pytest.mark.slow   # runs the tour: 3-6 min on 2 cores (shipped family; FedNL on Flower)
def test_the_tour_runs_as_written_on_a_clean_home(tmp_path):
    env = dict(os.environ, PLASTICLM_HOME=str(tmp_path / "home"), PLASTICLM_THREADS="2")
    work = tmp_path / "work"
    work.mkdir()
    exe = str(Path(sys.executable).parent / "plasticlm")
    for page, words in tour_commands():
        if NEEDS_HUB_OR_GPU.search(" ".join(words)):
            continue
        argv = [exe, *words[1:], *(["--quick"] if offers_quick(words) else [])]
        out = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, f"{page}: {' '.join(words)}\n{out.stderr[-2000:]}"
    for page, body in blocks("python"):
        out = subprocess.run([sys.executable, "-c", body], cwd=work, env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"{page}'s Python tour:\n{out.stderr[-3000:]}"
