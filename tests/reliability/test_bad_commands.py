"""Bad input through every command, as a careless user types it: missing and damaged files,
directories where files belong, unknown and mistyped settings, impossible sizes and names.
Each gets exit status 2 and one line that says what was wrong, no traceback, and nothing
written (``OUT`` is never created)."""

import signal
from pathlib import Path

import pytest

from plasticlm.cli import main

NOPE = "/nonexistent/plasticlm-bad-input"
GARBAGE = "GARBAGE"          # a file of random bytes
FOLDER = "FOLDER"            # an empty folder
TEXT = "TEXT"                # a small text file
OUT = "OUT"                  # where a command would write
MODEL = "MODEL"              # a real tiny model folder
SECONDS = 20                 # a command that accepted bad input and started serving

# (command, arguments that are not bad) — each bad input below is tried with each
CONFIGURED = {
    "fednl run": ["--quick"], "fednl compare": ["--quick"], "fednl experiment": ["niah", "--quick"],
    "refine experiment": ["transfer", "--quick"], "scol train": ["--quick", "--out", OUT],
    "scol experiment": ["squad", "--quick", "--out", OUT], "models pretrain": ["--text", TEXT, "--out", OUT],
    "refine train-fuser": ["--receiver", MODEL, "--transmitter", MODEL, "--out", OUT],
    "data world": ["--out", OUT],
}
CONFIG_BAD = [
    ["--config", NOPE + ".toml"], ["--config", GARBAGE], ["--config", FOLDER],
    ["--config", TEXT], ["--set", "nope=1"], ["--set", "rounds"], ["--set", "=3"],
    ["--set", "seed=abc"], ["--set", "seed=1.5"], ["--set", "seed=[1,2]"], ["--set", "name="],
]
RUNTIME = ["fednl run", "fednl experiment", "refine train-fuser", "scol train", "models info",
           "models generate", "refine ask"]
RUNTIME_BAD = [["--device", "quantum"], ["--dtype", "int3"], ["--device", "cuda:99"]]
BASE = {"fednl run": ["--quick"], "fednl experiment": ["niah", "--quick"], "refine train-fuser": ["--receiver", MODEL,
        "--transmitter", MODEL, "--out", OUT], "scol train": ["--quick", "--out", OUT],
        "models info": [MODEL], "models generate": [MODEL],
        "refine ask": ["hi", "--receiver", MODEL]}

SPECIFIC = [
    # missing, garbage and mistaken files and folders
    ["models", "info", NOPE], ["models", "info", GARBAGE], ["models", "info", FOLDER],
    ["models", "info", TEXT], ["models", "generate", NOPE], ["models", "generate", FOLDER],
    ["models", "import-llama2c", NOPE, NOPE, OUT], ["models", "import-llama2c", GARBAGE,
                                                    GARBAGE, OUT],
    ["models", "import-llama2c", TEXT, TEXT, OUT], ["models", "import-llama2c", FOLDER,
                                                    FOLDER, OUT],
    ["models", "pretrain", "--text", NOPE, "--out", OUT],
    ["models", "pretrain", "--text", FOLDER, "--out", OUT],
    ["models", "pretrain", "--preset", "nope"],
    ["data", "inspect", NOPE], ["data", "inspect", GARBAGE], ["data", "inspect", FOLDER],
    ["data", "niah", "--haystack", NOPE, "--out", OUT],
    ["data", "niah", "--haystack", GARBAGE, "--out", OUT],
    ["data", "niah", "--tokenizer", NOPE, "--out", OUT],
    ["memory", "info", NOPE], ["memory", "info", FOLDER], ["memory", "info", GARBAGE],
    ["memory", "info", MODEL],
    ["refine", "ask", "hi", "--receiver", NOPE], ["refine", "ask", "hi", "--receiver", FOLDER],
    ["refine", "ask", "hi", "--receiver", MODEL, "--transmitter", NOPE],
    ["refine", "ask", "hi", "--receiver", MODEL, "--transmitter", MODEL, "--fuser", NOPE],
    ["refine", "ask", "hi", "--receiver", MODEL, "--transmitter", MODEL, "--fuser", FOLDER],
    ["refine", "ask", "hi", "--receiver", MODEL, "--transmitter", MODEL, "--registry", NOPE],
    ["refine", "ask", "hi", "--receiver", MODEL, "--transmitter", MODEL, "--registry",
     FOLDER],
    ["refine", "train-fuser", "--receiver", NOPE, "--transmitter", MODEL, "--out", OUT],
    ["refine", "train-fuser", "--receiver", MODEL, "--transmitter", GARBAGE, "--out", OUT],
    ["refine", "train-fuser", "--receiver", MODEL, "--transmitter", MODEL, "--out", OUT,
     "--mmlu", NOPE],
    ["refine", "pretrain-fuser", "--receiver", MODEL, "--transmitter", MODEL, "--registry",
     OUT, "--corpus", NOPE],
    ["refine", "pretrain-fuser", "--receiver", NOPE, "--transmitter", MODEL, "--registry",
     OUT],
    ["refine", "serve", "--model", NOPE], ["refine", "serve", "--model", FOLDER],
    ["refine", "serve", "--model", MODEL, "--registry", NOPE],
    ["refine", "serve", "--model", MODEL, "--tls-cert", NOPE, "--tls-key", NOPE],
    ["refine", "serve", "--model", MODEL, "--tls-cert", GARBAGE],
    ["refine", "registry", "--folder", NOPE], ["refine", "registry", "--folder", GARBAGE],
    ["refine", "registry", "--folder", FOLDER, "--tls-cert", GARBAGE, "--tls-key", GARBAGE],
    ["scol", "run", "--policy", NOPE, "--out", OUT],
    ["scol", "run", "--policy", FOLDER, "--out", OUT],
    ["scol", "experiment", "squad", "--policy", NOPE, "--out", OUT],
    ["scol", "experiment", "squad", "--sweep", NOPE, "--out", OUT],
    ["report", NOPE], ["report", GARBAGE], ["report", FOLDER],
    ["fednl", "run", "--quick", "--set", f"data.source={NOPE}", "--set", f"outputs.out={OUT}"],
    ["fednl", "run", "--quick", "--set", f"model={NOPE}", "--set", f"outputs.out={OUT}"],
    ["fednl", "run", "--quick", "--set", f"model={FOLDER}", "--set", f"outputs.out={OUT}"],
    # impossible sizes and numbers
    ["data", "niah", "--n", "0", "--out", OUT], ["data", "niah", "--n", "-3", "--out", OUT],
    ["data", "niah", "--length", "0", "--out", OUT],
    ["data", "niah", "--depth", "1.5", "--out", OUT],
    ["data", "niah", "--depth", "nan", "--out", OUT],
    ["models", "generate", MODEL, "--max-new-tokens", "0"],
    ["models", "generate", MODEL, "--max-new-tokens", "-1"],
    ["models", "generate", MODEL, "--temperature", "-1"],
    ["models", "generate", MODEL, "--temperature", "nan"],
    ["models", "build-tiny", "llama", OUT, "--hidden-size", "0"],
    ["models", "build-tiny", "llama", OUT, "--num-layers", "-1"],
    ["models", "build-tiny", "llama", OUT, "--hidden-size", "30", "--num-heads", "4"],
    ["models", "build-tiny", "llama", OUT, "--num-heads", "4", "--num-kv-heads", "3"],
    ["models", "build-tiny", "llama", OUT, "--vocab-size", "0"],
    ["memory", "mqar", "--set", "steps=0", "--out", OUT],
    ["memory", "mqar", "--set", "seq_len=-4", "--out", OUT],
    ["memory", "mqar", "--set", "lr=nan", "--out", OUT],
    ["memory", "mqar", "--set", "rank=0", "--out", OUT],
    ["memory", "mqar", "--set", "hidden=30", "--set", "heads=4", "--out", OUT],
    ["memory", "mqar", "--set", "recurrent=maybe", "--out", OUT],
    ["memory", "mqar", "--set", "stepz=10", "--out", OUT],
    ["memory", "mqar", "--threads", "2", "--set", "threads=3", "--out", OUT],
    ["memory", "mqar", "--steps", "10", "--out", OUT],
    ["refine", "ask", "hi", "--receiver", MODEL, "--max-new-tokens", "0"],
    ["refine", "ask", "hi", "--receiver", MODEL, "--rounds", "0"],
    ["refine", "ask", "hi", "--receiver", MODEL, "--timeout", "-1", "--peer",
     "http://127.0.0.1:9"],
    ["refine", "pretrain-fuser", "--receiver", MODEL, "--transmitter", MODEL, "--registry",
     OUT, "--examples", "0"],
    ["refine", "serve", "--model", MODEL, "--port", "70000"],
    ["refine", "serve", "--model", MODEL, "--max-payload-mb", "0"],
    ["refine", "serve", "--model", MODEL, "--timeout", "-5"],
    ["refine", "registry", "--folder", FOLDER, "--port", "-1"],
    ["refine", "registry", "--folder", FOLDER, "--max-payload-mb", "-1"],
    ["bench", "--threads", "0", "--out", OUT],
    ["fednl", "run", "--quick", "--set", "train.rounds=-1", "--set", f"outputs.out={OUT}"],
    ["fednl", "run", "--quick", "--set", "data.num_clients=0", "--set", f"outputs.out={OUT}"],
    ["fednl", "run", "--quick", "--set", "train.lr=-1", "--set", f"outputs.out={OUT}"],
    ["fednl", "run", "--quick", "--set", "train.lr=nan", "--set", f"outputs.out={OUT}"],
    ["fednl", "run", "--quick", "--set", "federation.min_clients=99", "--set",
     f"outputs.out={OUT}"],
    ["fednl", "run", "--quick", "--set", "data.max_test=0", "--set", f"outputs.out={OUT}"],
    ["scol", "train", "--quick", "--set", "outer_steps=0", "--out", OUT],
    ["scol", "train", "--quick", "--set", "inner_lr=-1", "--out", OUT],
    ["scol", "experiment", "squad", "--quick", "--set", "seeds=[]", "--out", OUT],
    ["refine", "experiment", "transfer", "--quick", "--set", "seeds=[]"],
    ["models", "pretrain", "--text", TEXT, "--out", OUT, "--set", "lr=-1"],
    ["models", "pretrain", "--text", TEXT, "--out", OUT, "--set", "batch_size=0"],
    # names that are not one of the choices
    ["fednl", "experiment", "nope"], ["scol", "experiment", "nope"],
    ["refine", "experiment", "nope"],
    ["fednl", "run", "--quick", "--set", "method.name=nope", "--set", f"outputs.out={OUT}"],
    ["fednl", "run", "--quick", "--set", "data.split=nope", "--set", f"outputs.out={OUT}"],
    ["fednl", "run", "--quick", "--set", "aggregation.rule=nope", "--set",
     f"outputs.out={OUT}"],
    ["fednl", "run", "--quick", "--set", "eval.local_eval=sometimes", "--set",
     f"outputs.out={OUT}"],
    ["fednl", "compare", "--quick", "--methods", "fednl,nope", "--set", f"outputs.out={OUT}"],
    ["fednl", "compare", "--quick", "--methods", ",", "--set", f"outputs.out={OUT}"],
    ["refine", "ask", "hi", "--receiver", MODEL, "--mode", "nope"],
    ["refine", "ask", "hi", "--receiver", MODEL, "--mode", "c2c"],
    ["refine", "ask", "hi", "--receiver", MODEL, "--quant", "int3", "--peer",
     "http://127.0.0.1:9"],
    ["refine", "ask", "hi", "--receiver", MODEL, "--choices", ""],
    ["refine", "ask", "hi", "--receiver", MODEL, "--peer", "not a url"],
    ["refine", "ask", "hi", "--receiver", "http://127.0.0.1:9"],
    ["refine", "serve", "--model", MODEL, "--quant", "int3"],
    ["refine", "serve", "--model", MODEL, "--peer", "not a url"],
    ["data", "niah", "--task", "nope", "--out", OUT],
    ["models", "build-tiny", "gpt5", OUT],
    ["models", "pretrain", "--preset", "sandbox", "--text", TEXT],
    ["scol", "train", "--quick", "--dtype", "bfloat16", "--out", OUT],
    ["report", FOLDER, "--tensorboard", NOPE + "/x/y"],
]


def cases():
    for command, base in CONFIGURED.items():
        for bad in CONFIG_BAD:
            yield [*command.split(), *base, *bad]
    for command in RUNTIME:
        for bad in RUNTIME_BAD:
            yield [*command.split(), *BASE.get(command, []), *bad]
    yield from SPECIFIC


CASES = list(cases())


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from plasticlm.sandbox import sandbox_model

    root = tmp_path_factory.mktemp("bad")
    (root / "garbage.bin").write_bytes(bytes(range(256)) * 7)
    (root / "folder").mkdir()
    (root / "text.txt").write_text("once upon a time there was a text\n" * 4)
    return {GARBAGE: str(root / "garbage.bin"), FOLDER: str(root / "folder"),
            TEXT: str(root / "text.txt"), MODEL: str(sandbox_model("receiver", preset="quick"))}


def _fill(arg: str, names: dict[str, str]) -> str:
    """``key=NAME`` (a --set value) with NAME replaced by its path."""
    key, eq, value = arg.partition("=")
    return f"{key}={names[value]}" if eq and value in names else arg


def _timeout(signum, frame):
    raise TimeoutError(f"still running after {SECONDS}s: the bad input was accepted")


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(c)[:80] for c in CASES])
def test_bad_input_gets_one_line_and_writes_nothing(argv, inputs, tmp_path, capsys):
    out = tmp_path / "out"
    names = {**inputs, OUT: str(out)}
    argv = [names.get(a, _fill(a, names)) for a in argv]
    before = sorted(Path(inputs[FOLDER]).rglob("*"))
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(SECONDS)
    try:
        status = main(argv)
    except SystemExit as e:          # argparse: usage and one error line
        status = e.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    err = capsys.readouterr().err
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert status == 2, err
    assert "Traceback" not in err, err
    assert lines and (lines[-1].startswith("plasticlm: ") or ": error: " in lines[-1]), err
    ours = [x for x in lines if x.startswith("plasticlm: ")]
    assert len(ours) <= 1, err
    assert not out.exists(), f"{out} was written"
    assert sorted(Path(inputs[FOLDER]).rglob("*")) == before, "the folder given was written"
