"""Bad input gets the project's one-line error: damaged model, fuser, theta and adapter files,
and any text given as a config override (fuzzed)."""

import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from plasticlm.config import load_config
from plasticlm.errors import PlasticError
from plasticlm.experiments.scol.setup import ExperimentConfig
from plasticlm.fednl.config import FedNLConfig
from plasticlm.models import build_tiny, load_causal_lm
from plasticlm.refine import Fuser, FuserConfig
from plasticlm.tensor_files import load_tensors


@pytest.mark.parametrize("content", [b"", b"garbage", b"\x10\x00\x00\x00\x00\x00\x00\x00{"])
def test_garbage_and_truncated_tensor_files_are_one_clear_error(tmp_path, content):
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(content)
    with pytest.raises(PlasticError, match="not a readable safetensors file"):
        load_tensors(bad, "theta")
    with pytest.raises(PlasticError, match="does not exist"):
        load_tensors(tmp_path / "missing.safetensors", "theta")


def test_a_truncated_model_folder_is_one_clear_error(tmp_path):
    model = build_tiny("llama", vocab_size=64, hidden_size=32, num_layers=1, num_heads=2)
    model.save_pretrained(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(PlasticError, match="could not load the model folder"):
        load_causal_lm(tmp_path / "m")


def test_damaged_fuser_folders_are_one_clear_error(tmp_path):
    layout = dict(receiver_layers=2, receiver_kv_heads=1, receiver_head_dim=8,
                  transmitter_layers=2, transmitter_kv_heads=1, transmitter_head_dim=8)
    fuser = Fuser(FuserConfig(**layout), torch.ones(4), torch.ones(4))
    good = fuser.save_pretrained(tmp_path / "f")
    Fuser.from_pretrained(good)
    for name, damage in (("config", lambda d: (d / "fuser_config.json").write_text("{")),
                         ("weights", lambda d: (d / "fuser.safetensors").write_bytes(b"x")),
                         ("shapes", lambda d: save_file({"w": torch.zeros(1)},
                                                        str(d / "fuser.safetensors")))):
        broken = tmp_path / name
        shutil.copytree(good, broken)
        damage(broken)
        with pytest.raises(PlasticError):
            Fuser.from_pretrained(broken)


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(["train.rounds", "train.lr", "name", "method.name",
                            "aggregation.rule", "aggregation.clip", "data.max_train",
                            "memory.mix", "nope", "method.nope", "data", ""]),
       value=st.text(max_size=12))
def test_any_override_text_works_or_is_refused_cleanly(key, value):
    for cls in (FedNLConfig, ExperimentConfig):
        try:
            load_config(cls, None, [f"{key}={value}"])
        except PlasticError:
            pass


@pytest.mark.parametrize("argv, message", [
    (["data", "niah", "--n", "0", "--out", "OUT"], "argument --n: 0 is not in [1, "),
    (["refine", "train-fuser", "--receiver", "r", "--transmitter", "t", "--out", "OUT",
      "--set", "epochs=0"], "config epochs: input should be greater than 0, got 0"),
    (["fednl", "run", "--quick", "--set", "train.rounds=0"],
     "config train.rounds: input should be greater than 0, got 0"),
    (["scol", "experiment", "squad", "--quick", "--set", "eval_length=-1"],
     "config eval_length: input should be greater than or equal to 1, got -1"),
    (["models", "pretrain", "--text", "x.txt", "--out", "OUT", "--set", "steps=0"],
     "config steps: input should be greater than 0, got 0"),
])
def test_zero_and_negative_sizes_are_refused_before_anything_is_written(tmp_path, capsys, argv,
                                                                        message):
    from plasticlm.cli import main

    out = tmp_path / "out"
    argv = [str(out) if a == "OUT" else a for a in argv]
    try:
        status = main(argv)
    except SystemExit as e:   # argparse's own refusal of a bounded option: usage and one line
        status = e.code
    assert status == 2
    assert message in capsys.readouterr().err and not out.exists()
