"""Run-time conventions: --device/--dtype through runtime.runtime to every model a command
loads, clear errors for devices this machine lacks, and the one logging set-up."""

import json
import logging
import os

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

from plasticlm.cli import main
from plasticlm.env import DEVICE_ENV, DTYPE_ENV
from plasticlm.errors import PlasticError
from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.refine import Fuser, kv_layout
from plasticlm.runtime import pick_device, pick_dtype, runtime

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A receiver and a transmitter folder (tiny models with their tokenizers)."""
    root = tmp_path_factory.mktemp("runtime")
    texts = ["Q: Which organ does Kalomira act on? A: liver.", "Doctors prescribe Zutorex."] * 8
    for name, arch, vocab in (("r", "qwen3", 280), ("t", "llama", 260)):
        tok = train_bpe_tokenizer(texts, vocab_size=vocab)
        build_tiny(arch, seed=len(name), vocab_size=len(tok), hidden_size=32, num_layers=2,
                   num_heads=2, num_kv_heads=1, head_dim=16,
                   intermediate_size=64).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    layouts = [kv_layout(AutoModelForCausalLM.from_pretrained(root / n)) for n in "rt"]
    fuser = Fuser.for_pair(*layouts, rank=4)
    with torch.no_grad():  # open gates and random output maps: the fuser changes answers
        for layer in fuser.layers:
            for path in (layer.key_path, layer.value_path):
                path.out.weight.normal_(0, 0.5)
            layer.gate_logits.fill_(2.0)
    fuser.save_pretrained(root / "fuser")
    return {"r": str(root / "r"), "t": str(root / "t"), "fuser": str(root / "fuser")}


@pytest.fixture
def no_runtime_env(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    monkeypatch.delenv(DTYPE_ENV, raising=False)


def test_device_and_dtype_resolve_argument_then_env_then_default(monkeypatch, no_runtime_env):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device() == torch.device("cpu") and pick_dtype() == torch.float32
    monkeypatch.setenv(DTYPE_ENV, "bf16")
    assert pick_dtype() == torch.bfloat16 and pick_dtype("float16") == torch.float16
    with pytest.raises(PlasticError, match="unknown dtype 'float8'"):
        pick_dtype("float8")
    with pytest.raises(PlasticError, match="cuda:N"):
        pick_device("gpu")
    # the block's processes see the resolved choice ("auto" is never exported); then restored
    with runtime("auto", "float16") as (device, dtype):
        assert (device, dtype) == (torch.device("cpu"), torch.float16)
        assert (pick_device(), pick_dtype()) == (device, dtype)
        assert (os.environ[DEVICE_ENV], os.environ[DTYPE_ENV]) == ("cpu", "float16")
    assert DEVICE_ENV not in os.environ and os.environ[DTYPE_ENV] == "bf16"


def test_cuda_without_cuda_is_one_clear_line(folders, monkeypatch, capsys, no_runtime_env):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv in (["models", "info", folders["r"], "--device", "cuda"],
                 ["refine", "ask", "Q:", "--receiver", folders["r"], "--device", "cuda:1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "CUDA is not available" in err[0] and "--device cpu" in err[0]
    monkeypatch.setenv(DEVICE_ENV, "cuda")  # the environment is checked the same way
    assert main(["models", "info", folders["r"]]) == 2
    assert DEVICE_ENV in capsys.readouterr().err


def test_dtype_bfloat16_loads_bf16_weights_and_refine_ask_runs(folders, monkeypatch, capsys,
                                                               no_runtime_env):
    assert main(["models", "info", folders["r"], "--dtype", "bfloat16"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "bfloat16"
    assert main(["models", "info", folders["r"]]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "float32"
    # end to end: both peers load in bfloat16; the float32 fuser writes into their caches
    import plasticlm.refine.peer as peer

    loaded, load = [], peer.load_causal_lm

    def spy(*args, **kwargs):
        model, tok = load(*args, **kwargs)
        loaded.append(next(model.parameters()).dtype)
        return model, tok

    monkeypatch.setattr(peer, "load_causal_lm", spy)
    ask = ["refine", "ask", "Q: Which organ does Kalomira act on? A:", "--receiver",
           folders["r"], "--dtype", "bfloat16"]
    assert main([*ask, "--mode", "alone", "--max-new-tokens", "3"]) == 0
    assert "answer" in json.loads(capsys.readouterr().out)
    assert main([*ask, "--mode", "c2c", "--transmitter", folders["t"], "--fuser",
                 folders["fuser"], "--choices", "liver|heart"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["choice"] in ("liver", "heart") and out["wire_bytes"] > 0
    assert loaded == [torch.bfloat16] * 3


def test_the_device_flag_reaches_every_loaded_model(folders, monkeypatch, no_runtime_env):
    """On a machine with CUDA, --device cuda moves the model: here CUDA is pretended and the
    move recorded (a CPU build cannot make the move), so an ignored flag fails the test."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    moves = []

    def to(self, *args, **kwargs):
        moves.append(str(args[0] if args else kwargs.get("device")))
        return self

    monkeypatch.setattr(transformers.PreTrainedModel, "to", to)
    assert main(["models", "info", folders["r"], "--device", "cuda"]) == 0
    assert moves[-1] == "cuda"
    # auto would pick the pretended CUDA: only the flag itself gives the CPU
    assert main(["models", "info", folders["r"], "--device", "cpu"]) == 0
    assert moves[-1] == "cpu"


def test_flower_clients_get_a_gpu_share_only_on_cuda():
    from plasticlm.fednl.run import client_resources

    assert client_resources(torch.device("cpu"), 2) == {"num_cpus": 1, "num_gpus": 0.0}
    assert client_resources(torch.device("mps"), 2)["num_gpus"] == 0.0
    assert client_resources(torch.device("cuda"), 2)["num_gpus"] == 0.5
    assert client_resources(torch.device("cuda:0"), 1)["num_gpus"] == 1.0


def test_log_level_sets_the_one_handler(capsys):
    log = logging.getLogger("plasticlm.test")
    try:
        for _ in range(2):  # a second command adds no second handler
            assert main(["models", "info", "/nonexistent-model-dir"]) == 2
        capsys.readouterr()
        log.info("round 1/2: fed acc 0.5")
        err = capsys.readouterr().err
        assert err.count("round 1/2") == 1 and "INFO plasticlm.test" in err
        assert main(["--log-level", "WARNING", "models", "info", "/nonexistent-model-dir"]) == 2
        capsys.readouterr()
        log.info("hidden")
        log.warning("shown")
        err = capsys.readouterr().err
        assert "hidden" not in err and "shown" in err
    finally:
        logging.getLogger("plasticlm").setLevel(logging.WARNING)


def test_a_new_run_removes_only_an_earlier_run_folder(tmp_path, capsys):
    """A run's output folder is replaced only when it is empty or an earlier run's (it holds
    config.json): ``demo --out`` pointed at a user's folder exits 2 and removes nothing."""
    from plasticlm.runs import clear_run_folder

    earlier, empty, theirs = tmp_path / "earlier", tmp_path / "empty", tmp_path / "theirs"
    for folder in (earlier, empty, theirs):
        folder.mkdir()
    (earlier / "config.json").write_text("{}")
    (earlier / ".plasticlm").write_text('{"kind": "run"}')   # a plasticlm run's marker
    (theirs / "thesis.tex").write_text("years of work")
    clear_run_folder(earlier, "")
    clear_run_folder(empty, "")
    clear_run_folder(tmp_path / "absent", "")
    assert [p.name for p in earlier.iterdir()] == [".plasticlm"] and empty.is_dir()
    with pytest.raises(PlasticError, match="not written by plasticlm .*nothing was removed"):
        clear_run_folder(theirs, "")
    assert main(["demo", "--quick", "--out", str(theirs)]) == 2
    assert (theirs / "thesis.tex").read_text() == "years of work"
    assert "give another --out" in capsys.readouterr().err
