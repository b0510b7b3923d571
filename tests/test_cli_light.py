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


def test_quick_runs_write_to_their_own_folders():
    """--quick never writes into the full run's folder: argparse defaults gain -quick, the
    packaged quick presets name their own folders."""
    from plasticlm.cli import parse

    for argv, want in ((["demo", "--quick"], "runs/demo-quick"), (["demo"], "runs/demo"),
                       (["demo", "--quick", "--out", "runs/demo"], "runs/demo"),
                       (["demo", "--quick", "--out=mine"], "mine"),
                       (["scol", "train", "--quick"], "runs/scol-train-quick")):
        assert parse(argv).out == want, argv
    from plasticlm.config import load_config, preset_path
    from plasticlm.experiments.fednl.variants import ExperimentConfig
    from plasticlm.fednl.config import FedNLConfig

    quick = load_config(FedNLConfig, None, [], preset=preset_path("fednl", "quick"))
    assert quick.name != FedNLConfig().name
    quick = load_config(ExperimentConfig, None, [], preset=preset_path("fednl", "experiment-quick"))
    assert quick.out != ExperimentConfig().out
    for name in ("ladder", "transfer"):
        from plasticlm.experiments.refine.ladder import TransferConfig

        quick = load_config(TransferConfig, None, [], preset=preset_path("refine", f"{name}-quick"))
        assert quick.out != TransferConfig().out


def test_commands_whose_settings_are_options_take_config_and_set(tmp_path, capsys):
    """`--config FILE` / `--set KEY=VALUE` on the commands without a config class: a key is
    an option's name, checked by the option's own type, as if typed."""
    from plasticlm.cli import build_parser, main
    from plasticlm.cli.options import option_tokens
    from plasticlm.errors import PlasticError

    parser = build_parser()
    argv = ["models", "generate", "m", "--set", "max-new-tokens=5", "--set", "temperature=0.7"]
    args = parser.parse_args(argv)
    assert option_tokens(args, argv) == ["--max-new-tokens", "5", "--temperature", "0.7"]
    again = parser.parse_args([*argv, *option_tokens(args, argv)])
    assert again.max_new_tokens == 5 and again.temperature == 0.7
    config = tmp_path / "ask.toml"
    config.write_text('mode = "c2c"\nmax_new_tokens = 7\nprivate = true\n'
                      'transmitter = ["a", "b"]\n')
    argv = ["refine", "ask", "Q: x A:", "--receiver", "r", "--config", str(config)]
    args = parser.parse_args(argv)
    tokens = option_tokens(args, argv)
    again = parser.parse_args([*argv, *tokens])
    assert (again.mode, again.max_new_tokens, again.private, again.transmitter) == \
        ("c2c", 7, True, ["a", "b"])
    for argv, refusal in (
            (["models", "generate", "m", "--set", "colour=red"], "no option 'colour'"),
            (["models", "generate", "m", "--max-new-tokens", "3", "--set",
              "max_new_tokens=4"], "given twice"),
            (["refine", "ask", "p", "--receiver", "r", "--set", "private=3"], "a switch")):
        args = parser.parse_args(argv)
        try:
            option_tokens(args, argv)
        except PlasticError as e:
            assert refusal in str(e)
        else:
            raise AssertionError(f"{argv} was not refused")
    # a bad value is refused by the option's own type, as on the command line
    try:
        main(["models", "generate", "m", "--set", "max_new_tokens=many"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("a bad value was taken")
    assert "max-new-tokens" in capsys.readouterr().err
