"""Run folders, configuration, seeding and the CLI surface."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
from browser_page import BROWSER, rendered_counts

from plasticlm.cli import COMMANDS, build_parser, main
from plasticlm.config import Field, configclass, field_docs, load_config, parse_value, preset_path
from plasticlm.cpu import has_float_path
from plasticlm.env import THREADS_ENV
from plasticlm.errors import PlasticError
from plasticlm.runs import RunDir, cache_home
from plasticlm.runtime import seed_everything, set_threads, threads


@configclass
class Train:
    lr: float = Field(1e-3, description="how fast")
    steps: int = Field(10, description="optimiser steps, counted per client")


@configclass
class Cfg:
    name: str = "x"
    layers: tuple[int, ...] = (1, 2)
    train: Train = Field(default_factory=Train)


def test_config_file_then_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('name = "run"\n[train]\nlr = 1\n')
    cfg = load_config(Cfg, path, ["train.steps=5", "layers=[3, 4]"])
    assert cfg == Cfg(name="run", layers=(3, 4), train=Train(lr=1.0, steps=5))
    ycfg = tmp_path / "c.yaml"
    ycfg.write_text("train:\n  steps: 7\n")
    assert load_config(Cfg, ycfg).train.steps == 7


def test_config_errors_name_the_problem(tmp_path):
    with pytest.raises(PlasticError, match="train.lrr"):
        load_config(Cfg, None, ["train.lrr=1"])
    with pytest.raises(PlasticError, match="key=value"):
        load_config(Cfg, None, ["oops"])
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(PlasticError, match="bad.toml"):
        load_config(Cfg, bad)


def test_presets_then_file_then_overrides(tmp_path):
    preset = tmp_path / "quick.toml"
    preset.write_text('name = "quick"\n[train]\nsteps = 2\nlr = 0.5\n')
    mine = tmp_path / "mine.toml"
    mine.write_text("[train]\nsteps = 3\n")
    cfg = load_config(Cfg, mine, ["train.lr=0.25"], preset=preset)
    assert cfg == Cfg(name="quick", train=Train(lr=0.25, steps=3))
    with pytest.raises(PlasticError, match="known: experiment-quick, quick"):
        preset_path("fednl", "nope")
    for method, name in (("fednl", "quick"), ("fednl", "experiment-quick"),
                         ("refine", "transfer-quick"), ("scol", "quick")):
        assert preset_path(method, name).is_file()


def test_field_help_comes_from_its_description():
    docs = {k: (d, h) for k, d, h in field_docs(Cfg)}
    assert docs["train.steps"] == (10, "optimiser steps, counted per client")
    assert docs["train.lr"] == (1e-3, "how fast")
    assert docs["name"] == ("x", "")


def test_config_help_lists_every_key(capsys):
    with pytest.raises(SystemExit):
        main(["refine", "experiment", "--help"])
    out = capsys.readouterr().out
    assert "TransferConfig keys" in out and "teach_replay" in out and "fuser.hidden" in out
    assert "blocks of the world's general corpus replayed per" in out


def test_values_of_the_wrong_type_are_refused_before_any_work():
    with pytest.raises(PlasticError, match=r"config train.steps: input should be a valid "
                       r"integer, .*got 'abc'"):
        load_config(Cfg, None, ["train.steps=abc"])
    with pytest.raises(PlasticError, match="config layers: input should be a valid tuple"):
        load_config(Cfg, None, ["layers=3"])
    assert main(["fednl", "run", "--quick", "--set", "train.rounds=abc"]) == 2


def test_a_boolean_is_not_a_number():
    with pytest.raises(PlasticError, match="train.lr"):
        load_config(Cfg, None, ["train.lr=true"])


def test_parse_value():
    assert parse_value("3") == 3 and parse_value("true") is True
    assert parse_value("[1, 2]") == [1, 2] and parse_value("qwen3") == "qwen3"


def test_run_dir_writes_config_and_metrics(tmp_path):
    run = RunDir.create("r", Cfg(), root=tmp_path)
    run.log(step=1, loss=torch.tensor(2.5).item())
    run.log(step=2, loss=1.5)
    assert json.loads((tmp_path / "r" / "config.json").read_text())["train"]["steps"] == 10
    assert [m["step"] for m in run.metrics()] == [1, 2]



def test_run_dir_writes_strict_json_a_non_finite_number_is_null(tmp_path):
    """JSON has no NaN or Infinity: a run folder's files stay readable by any JSON parser."""
    run = RunDir.create("r", root=tmp_path)
    run.write_json("report.json", {"gate": float("nan"), "rows": [1.0, float("inf")],
                                   "t": torch.tensor([float("nan"), 2.0])})
    run.log(loss=float("nan"))

    def refuse(token):
        raise ValueError(token)

    report = json.loads((tmp_path / "r" / "report.json").read_text(), parse_constant=refuse)
    assert report == {"gate": None, "rows": [1.0, None], "t": [None, 2.0]}
    line = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()[0]
    assert json.loads(line, parse_constant=refuse)["loss"] is None

def test_seeding_repeats():
    seed_everything(7)
    a = torch.randn(3)
    seed_everything(7)
    assert torch.equal(a, torch.randn(3))


def test_cache_home_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PLASTICLM_HOME", str(tmp_path / "h"))
    assert cache_home() == tmp_path / "h" and (tmp_path / "h").is_dir()


def test_thread_policy_resolves_argument_then_env_then_cores(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setenv(THREADS_ENV, "1")
    with threads() as n:
        assert n == torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    monkeypatch.setenv(THREADS_ENV, "3")
    with threads(1) as n:  # an explicit count beats the environment
        assert n == torch.get_num_threads() == 1
    monkeypatch.delenv(THREADS_ENV)
    with threads() as n:
        assert n == torch.get_num_threads() == (os.cpu_count() or 1)
    with pytest.raises(RuntimeError), threads(1):
        raise RuntimeError("the count is restored even so")
    assert torch.get_num_threads() == before
    monkeypatch.setenv(THREADS_ENV, "many")
    with pytest.raises(PlasticError, match=THREADS_ENV):
        set_threads()
    with pytest.raises(PlasticError, match=">= 1"):
        set_threads(0)
    assert torch.get_num_threads() == before


def test_cli_threads_is_a_global_option(monkeypatch):
    args = build_parser().parse_args(["--threads", "1", "memory", "mqar", "--threads", "3"])
    assert (args.global_threads, args.threads) == (1, 3)
    assert build_parser().parse_args(["memory", "info", "x"]).global_threads is None
    before = torch.get_num_threads()
    with pytest.raises(SystemExit) as refused:   # argparse: usage and one line
        main(["--threads", "0", "memory", "info", "x"])
    assert refused.value.code == 2
    monkeypatch.setenv(THREADS_ENV, "1")
    seen = []
    monkeypatch.setattr("plasticlm.cli.memory._info", lambda args: seen.append(
        torch.get_num_threads()))
    assert main(["memory", "info", "x"]) == 0 and seen == [1]
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_explains_itself(command, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([command, "--help"])
    assert e.value.code == 0
    assert len(capsys.readouterr().out) > 100


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "plasticlm.cli", "--help"], capture_output=True,
                         text=True, check=True)
    assert "models" in out.stdout


def test_demo_quick_runs_to_a_result(tmp_path, capsys):
    """Every stage with its control, in run order, then the report (about 15 s with the
    shipped quick models)."""
    assert main(["demo", "--quick", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "held-out MC" in out and "smoke run" in out
    assert "the oracle: taught in this run" in out     # the quick receiver has no shipped copy
    # each stage beside its controls
    for row in ("| memory (FedNL theta) |", "| window + LoRA |", "| window, untrained |",
                "| b. hand-over (ceiling), oracle |", "| b. hand-over, receiver |",
                "| c. cache regression on dev/val prompts, oracle |",
                "| c. cache regression on dev/val prompts, receiver |",
                "| (b) one update, passage entity |", "| (a) untouched, passage entity |",
                "| (c) one update, paired entity never shown |"):
        assert row in out, row
    stages = [json.loads(x)["stage"] for x in (tmp_path / "demo" / "metrics.jsonl").read_text().splitlines()]
    assert stages[-7:] == ["sandbox", "memory", "fednl", "refine", "scol", "headlines", "end"]
    # each paper's headline beside this run's verdict, from the run's own intervals
    for method in ("FedNL", "FedRefine", "SCoL"):
        assert f"| {method} |" in out, method
    headlines = json.loads((tmp_path / "demo" / "metrics.jsonl").read_text().splitlines()[-2])
    assert set(headlines["verdicts"]) == {"FedNL", "FedRefine", "SCoL"}
    page = tmp_path / "demo" / "report" / "index.html"
    assert f"report: {page}" in out and out.rindex("report:") > out.rindex("| SCoL |")
    html = page.read_text()
    for part in ("<h3>Sandbox</h3>", "<h3>Memory</h3>", "<h3>FedNL</h3>", "refine", "<h3>SCoL</h3>",
                 "cpu seconds"):
        assert part in html, part
    assert html.count("data:image/png;base64,") == 3   # one figure per method
    if BROWSER:   # the demo's own page, rendered: every plot decodes, no error, no overflow
        counts = rendered_counts(page)
        assert counts["images-rendered"] == counts["images"] == 3
        assert counts["errors"] == 0, counts
        assert counts["overflowing"] == 0, counts["overflow-what"]
    # the stages' tables in the order they ran, not alphabetical
    order = [html.index(f"<h3>{t}</h3>") for t in ("Sandbox", "Memory", "FedNL", "SCoL")]
    assert order == sorted(order)


def test_version_and_log_level(capsys):
    """--version names the package and the pinned stack; --log-level sets plasticlm's
    logger (and rejects levels that do not exist)."""
    import logging

    from plasticlm import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert f"plasticlm {__version__}" in out and "torch" in out and "flwr" in out
    with pytest.raises(SystemExit):
        main(["--log-level", "LOUD", "data", "--help"])
    assert main(["--log-level", "DEBUG", "refine", "experiment", "--set", "nonsense"]) == 2
    assert logging.getLogger("plasticlm").level == logging.DEBUG
    logging.getLogger("plasticlm").setLevel(logging.WARNING)


def test_progress_bars_in_a_log_become_plain_lines():
    import io

    from tqdm import tqdm

    from plasticlm.cli import LogLines

    log = io.StringIO()
    for _ in tqdm(range(3), file=LogLines(log), mininterval=0, desc="steps"):
        pass
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and all(line.startswith("steps:") for line in lines)
    assert len(lines) >= 4 and "3/3" in lines[-1]


def test_bench_quick_names_every_peer_and_agrees_with_the_reference(tmp_path, capsys):
    assert main(["bench", "--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    for row in report["delta_rule"]:                  # same numbers as transformers' kernel
        assert row["max_abs_diff_o_vs_transformers"] < 1e-4
        assert row["max_abs_diff_state_vs_transformers"] < 1e-4
    assert report["state"][-1]["ratio"] > report["state"][0]["ratio"] > 1   # O(1) vs O(T)
    lines = capsys.readouterr().out
    for peer in ("transformers' torch_chunk_gated_delta_rule", "full KV cache",
                 "LoRA-FedAvg, same rank", "full FedAvg", "matmul floor", "vs t2t",
                 "sequential fine-tuning"):
        assert peer in lines
    refine = {r["mode"]: r for r in report["refine"]}
    assert refine["alone"]["wire_bytes"] == 0 < refine["t2t"]["wire_bytes"] \
        < refine["c2c"]["wire_bytes"]                  # text is small, caches are not
    assert all(r["floor_s"] > 0 and r["over_floor"] > 1 for r in report["delta_rule"])
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert (tmp_path / "report" / "index.html").exists()


def test_training_bar_in_a_log_draws_at_its_interval_not_every_step(monkeypatch, capsys):
    """A loss in the bar's postfix must not force a frame per step (tqdm's set_postfix
    refreshes by default): at a 30 s interval, 40 quick steps draw one or two frames."""
    from plasticlm.models import train_steps

    monkeypatch.setenv("TQDM_MININTERVAL", "30")
    layer = torch.nn.Linear(4, 1)
    train_steps(layer, lambda step: layer.weight.square().sum(), 40, warmup=2, desc="steps")
    frames = [f for f in capsys.readouterr().err.replace("\r", "\n").splitlines() if f.strip()]
    assert 1 <= len(frames) <= 2 and all(f.startswith("steps:") for f in frames)


def test_machine_names_the_cpu_and_the_simd_level_torch_uses():
    from plasticlm.runtime import machine

    info = machine()
    assert info["cpu"] and info["cpu_count"] >= 1 and info["torch"] == torch.__version__
    assert info["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()


@pytest.mark.skipif(not has_float_path(), reason="the float path is pinned only on CPUs with AVX2")
def test_configure_pins_one_float_path_import_changes_nothing_and_a_users_choice_wins():
    """``plasticlm.cpu.configure()`` before torch fixes torch's SIMD level and MKL's path at
    AVX2 (the sandbox family's), as the command does first thing; importing plasticlm alone
    leaves the process as it was; a value the user set is kept and reaches torch."""
    report = ("import os, torch; print(torch.backends.cpu.get_cpu_capability(), "
              "os.environ.get('MKL_CBWR'), os.environ.get('ATEN_CPU_CAPABILITY'))")
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}

    def run(code: str, **extra) -> list[str]:
        return subprocess.run([sys.executable, "-c", code + "\n" + report], capture_output=True,
                              text=True, check=True, env={**env, **extra}).stdout.split()
    plain = run("import torch")
    assert run("import plasticlm, plasticlm.memory") == plain
    assert run("import plasticlm.cpu as c; c.configure()") == ["AVX2", "AVX2", "avx2"]
    command = "import contextlib\nfrom plasticlm.cli import main\nwith contextlib.suppress(" \
        "SystemExit):\n    main(['--version'])"
    assert run(command)[-3:] == ["AVX2", "AVX2", "avx2"]
    assert run("import plasticlm.cpu as c; c.configure()", ATEN_CPU_CAPABILITY="default",
               MKL_CBWR="COMPATIBLE") == ["DEFAULT", "COMPATIBLE", "default"]


def test_a_typo_in_a_choice_is_refused_naming_the_choices(tmp_path):
    from plasticlm.data.niah import NIAHConfig
    from plasticlm.eval import MCConfig
    from plasticlm.sandbox.world import WorldConfig

    with pytest.raises(PlasticError, match="config method: input should be 'letters', "
                       "'continuation' or 'generate', got 'leters'"):
        load_config(MCConfig, None, ["method=leters"])
    path = tmp_path / "world.toml"
    path.write_text('specialist_domain = "pharmacolgy"\n')
    with pytest.raises(PlasticError, match="config specialist_domain: input should be "
                       "'pharmacology', 'software', 'biography', 'law' or 'geography', got "
                       "'pharmacolgy'"):
        load_config(WorldConfig, path)
    with pytest.raises(PlasticError, match="unknown NIAH task 'multikye'; choose one of single, "
                       "multikey, multivalue, multiquery, uuid, numeric, vartrack"):
        NIAHConfig("multikye")


def test_scol_follows_the_commands_thread_policy_unless_its_config_names_one(monkeypatch):
    """SCoL's `threads` used to default to 1 and override `--threads`; now it is null (the
    command's policy) unless set."""
    import plasticlm.experiments.scol.setup as scol_setup
    from plasticlm.experiments.scol.setup import ExperimentConfig, quick_config

    monkeypatch.setattr(scol_setup, "load_causal_lm", lambda *a, **k: (torch.nn.Linear(1, 1),
                                                                        None))
    monkeypatch.setattr(scol_setup, "float32_master", lambda m: m)
    monkeypatch.setattr(scol_setup, "resolve_model", lambda cfg: "no model")
    assert ExperimentConfig().threads is None and quick_config().threads is None
    with threads(2):
        scol_setup.load_model(quick_config())
        assert torch.get_num_threads() == 2
        scol_setup.load_model(dataclasses.replace(quick_config(), threads=1))
        assert torch.get_num_threads() == 1


def test_package_metadata_says_who_what_and_that_it_is_typed():
    """The distribution carries authors, classifiers and keywords, and ships py.typed (PEP
    561) so that type checkers read plasticlm's annotations."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    meta = project["project"]
    assert meta["authors"] and meta["keywords"]
    assert "Typing :: Typed" in meta["classifiers"]
    assert (root / "src" / "plasticlm" / "py.typed").is_file()
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["plasticlm"]
