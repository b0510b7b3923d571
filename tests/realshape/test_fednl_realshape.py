"""FedNL at the published shapes: a client's round and evaluation on each shape, in float32
and bfloat16, and one Flower round of two clients on Qwen2.5-0.5B's shape."""

import json

import pytest
import torch

from plasticlm.cli import main
from plasticlm.config import from_dict, override
from plasticlm.fednl.build import tasks_for
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.local_round import local_update
from plasticlm.fednl.methods import prepare_model
from plasticlm.fednl.theta import get_theta
from plasticlm.models.shapes import TESTED_SHAPES

RUN = from_dict(FedNLConfig, {
    "data": {"source": "sandbox-quick", "split": "dirichlet", "num_clients": 2,
             "max_train": 4, "max_test": 3},
    "method": {"name": "fednl", "window": 16, "lora_rank": 4},
    "memory": {"layers": "all"},
    "train": {"local_steps": 1, "batch_size": 2}})


def _tasks(spec: str):
    return tasks_for(override(RUN, {"model": spec}))


# the Qwen shapes in `make test`; Llama's (21 s: a 128,256 x 2,048 embedding) in the slow lane
@pytest.mark.parametrize("shape", [
    pytest.param(s, marks=pytest.mark.slow) if s == "llama-3.2-1b" else s for s in TESTED_SHAPES])
def test_a_fednl_client_round_and_its_evaluation(shape, shape_model, spec_of):
    _client_round(shape, *shape_model(shape), spec_of)


def test_a_fednl_client_round_in_bfloat16(shape_model, spec_of):
    # one shape: bfloat16 matmuls are slow on most CPUs, and the path is the same
    _client_round("qwen2.5-0.5b", *shape_model("qwen2.5-0.5b", dtype="bfloat16"), spec_of)


def _client_round(shape, model, tokenizer, spec_of):
    torch.manual_seed(0)
    model = prepare_model(model, RUN.method, RUN.memory)
    task = _tasks(spec_of(shape))[0]
    start = {k: v.clone() for k, v in get_theta(model).items()}
    theta, metrics = local_update(model, tokenizer, task, start, {}, RUN, seed=0)
    assert set(theta) == set(start) and all(v.dtype == torch.float32 for v in theta.values())
    assert all(torch.isfinite(v).all() for v in theta.values())
    assert any(not torch.equal(theta[k], start[k]) for k in theta)  # one step moved theta
    # random weights spread the mass over every logit: the loss is about ln(vocab)
    assert 0.5 * torch.log(torch.tensor(model.config.vocab_size)) < metrics["train_loss"] < 30
    scores = task.correct(model, tokenizer)
    assert len(scores) == len(task.test) and set(scores) <= {0.0, 1.0}


def test_the_nested_split_keeps_each_layers_gate_at_qwen3_shape(shape_model, spec_of):
    """fednl-personal on Qwen3-0.6B's shape (its own q/k norms beside the memory's names):
    exactly one gate per memory layer is personal; a round sends the received gates back,
    keeps its trained ones, and answers with them."""
    from plasticlm.fednl.methods import FedNLPersonal, is_personal

    run = override(RUN, {"method.name": "fednl-personal", "train.gate_lr": 1.0})
    model, tokenizer = shape_model("qwen3-0.6b")
    torch.manual_seed(0)
    model = prepare_model(model, run.method, run.memory)
    start = {k: v.clone() for k, v in get_theta(model).items()}
    personal = sorted(k for k in start if is_personal(k))
    assert len(personal) == model.config.num_hidden_layers
    assert all(k.endswith("gate_logit") for k in personal)
    state: dict = {}
    sent, _ = local_update(model, tokenizer, _tasks(spec_of("qwen3-0.6b"))[0], start, state,
                           run, seed=0)
    assert all(torch.equal(sent[k], start[k]) for k in personal)
    assert any(not torch.equal(sent[k], start[k]) for k in sent if k not in personal)
    own = FedNLPersonal().personalise(sent, state)
    assert all(not torch.equal(own[k], start[k]) for k in personal)   # its trained gates
    assert all(torch.equal(own[k], sent[k]) for k in sent if k not in personal)


@pytest.mark.slow  # 33 s: two client processes, each building the model
def test_one_flower_round_of_two_clients_at_qwen25_05b_shape(tmp_path, spec_of):
    name = "qwen2.5-0.5b"
    assert main(["fednl", "run", "--quick", "--set", f"model={spec_of(name)}",
                 "--set", "data.split=dirichlet", "--set", "data.num_clients=2",
                 "--set", "train.rounds=1", "--set", "data.max_train=4",
                 "--set", "data.max_test=3", "--set", "eval.local_eval=last",
                 "--set", "train.local_steps=1", "--set", "train.batch_size=2",
                 "--set", f"outputs.out={tmp_path}", "--set", "name=rs"]) == 0
    (record,) = [json.loads(x) for x in (tmp_path / "rs" / "metrics.jsonl").read_text().splitlines()]
    assert record["round"] == 1 and len(record["clients"]) == 2
    assert all(c["train_loss"] > 0 for c in record["clients"].values())
    assert record["bytes_up"] > 0
