"""Each method's client update and the aggregation, directly (no Flower engine)."""

import pytest
import torch

from plasticlm.data.records import MCQuestion
from plasticlm.errors import PlasticError
from plasticlm.eval import qa_line
from plasticlm.fednl.aggregate import reply_problem, weighted_mean
from plasticlm.fednl.methods import (
    METHODS,
    MethodConfig,
    get_theta,
    local_update,
    prepare_model,
    set_theta,
    trainable,
)
from plasticlm.fednl.task import ClientTask
from plasticlm.models import build_tiny, train_bpe_tokenizer

FACTS = [("Where was Alira Marrow born?", ("Korvale", "Belburg", "Astford", "Dunmere")),
         ("Which language is zenly written in?", ("Rust", "Go", "Zig", "OCaml")),
         ("Which organ does velazole act on?", ("liver", "kidneys", "lungs", "heart")),
         ("Who wrote the Corvell Act?", ("Veloria", "Kestmark", "Drumont", "Quorra"))]


@pytest.fixture(scope="module")
def tok():
    text = [qa_line(q, c) for q, cs in FACTS for c in cs] * 10
    return train_bpe_tokenizer(text, vocab_size=300)


@pytest.fixture(scope="module")
def task():
    qs = [MCQuestion("x", "dev", q, cs, "A", i) for i, (q, cs) in enumerate(FACTS)]
    return ClientTask("c0", "stem", qs, qs)


def fresh(method: str, tok, **kw):
    torch.manual_seed(0)
    model = build_tiny("qwen3", vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2,
                       num_kv_heads=1)
    cfg = MethodConfig(name=method, local_steps=6, batch_size=4, ala_steps=2, lr=1e-2,
                       full_lr=1e-2, memory_window=8, **kw)
    return prepare_model(model, cfg), cfg


def test_unknown_method_is_rejected(tok):
    with pytest.raises(PlasticError, match="unknown method"):
        fresh("fedsgd", tok)


def test_theta_is_exactly_what_each_method_trains(tok):
    from plasticlm.memory import meta_parameters

    model, _ = fresh("fednl", tok)
    assert {id(p) for p in trainable(model).values()} == \
        {id(p) for p in meta_parameters(model).values()}
    model, _ = fresh("fedavg", tok)
    names = set(trainable(model))
    assert names and all("lora_" in n for n in names)
    assert {n.split(".lora_")[0].split(".")[-1] for n in names} == {"q_proj", "k_proj", "v_proj"}
    full, _ = fresh("fedavg-full", tok)
    assert len(get_theta(full)) == len(list(full.parameters()))
    lora_bytes = sum(v.numel() for v in get_theta(model).values())
    assert lora_bytes < sum(v.numel() for v in get_theta(full).values()) / 5


@pytest.mark.parametrize("method", METHODS)
def test_local_update_learns_the_clients_answers(method, tok, task):
    model, cfg = fresh(method, tok)
    start = get_theta(model)
    acc0 = None
    if method != "fednl":  # the memory gate starts almost closed: accuracy moves slowly
        acc0 = task.accuracy(model, tok)
    state, theta = {}, start
    for r in range(3):
        theta, metrics = local_update(model, tok, task, theta, state, cfg, seed=r)
    assert set(theta) == set(start)
    assert any(not torch.equal(theta[k], start[k]) for k in theta)
    assert metrics["train_loss_last"] < 6.0 and metrics["train_loss_last"] == \
        metrics["train_loss_last"]
    if acc0 is not None and method != "fedavg-full":
        assert task.accuracy(model, tok) >= acc0


def test_fedprox_stays_closer_to_the_global_theta(tok, task):
    far = {}
    for mu in (0.0, 100.0):
        model, cfg = fresh("fedprox", tok, prox_mu=mu)
        g = get_theta(model)
        theta, _ = local_update(model, tok, task, g, {}, cfg, seed=0)
        far[mu] = sum(((theta[k] - g[k]) ** 2).sum().item() for k in g)
    assert far[100.0] < far[0.0]


def test_fedala_weights_stay_in_unit_interval_and_first_round_is_global(tok, task):
    model, cfg = fresh("fedala", tok)
    g = get_theta(model)
    state = {}
    local_update(model, tok, task, g, state, cfg, seed=0)
    assert not any(k.startswith("ala.") for k in state)  # round 1: nothing to mix yet
    assert any(k.startswith("local.") for k in state)
    g2 = {k: v + 0.01 for k, v in g.items()}
    local_update(model, tok, task, g2, state, cfg, seed=1)
    weights = [v for k, v in state.items() if k.startswith("ala.")]
    assert weights and all(((w >= 0) & (w <= 1)).all() for w in weights)
    top_layer = max(int(k.split("layers.")[1].split(".")[0]) for k in g)
    assert all(f"layers.{top_layer}." in k for k in state if k.startswith("ala."))


def test_fedssi_importances_are_non_negative_and_accumulate(tok, task):
    model, cfg = fresh("fedssi", tok)
    g = get_theta(model)
    state = {}
    theta, _ = local_update(model, tok, task, g, state, cfg, seed=0)
    first = {k: v.clone() for k, v in state.items() if k.startswith("si.")}
    assert first and all((v >= 0).all() for v in first.values())
    assert sum(v.sum() for v in first.values()) > 0
    local_update(model, tok, task, theta, state, cfg, seed=1)
    assert all((state[k] >= first[k]).all() for k in first)


def test_set_theta_checks_keys_and_shapes(tok):
    model, _ = fresh("fedavg", tok)
    theta = get_theta(model)
    with pytest.raises(PlasticError, match="missing"):
        set_theta(model, dict(list(theta.items())[1:]))
    k = next(iter(theta))
    with pytest.raises(PlasticError, match="shape"):
        set_theta(model, {**theta, k: torch.zeros(3)})


def test_weighted_mean_and_reply_validation():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([4.0])}
    mean = weighted_mean([a, b], [1, 3])
    assert torch.allclose(mean["w"], torch.tensor([2.5, 5.0]))
    assert torch.allclose(mean["b"], torch.tensor([3.0]))
    assert reply_problem(b, a) is None
    assert "wrong keys" in reply_problem({"w": a["w"]}, a)
    assert "shape" in reply_problem({"w": torch.zeros(3), "b": a["b"]}, a)
    assert "NaN" in reply_problem({"w": torch.tensor([float("nan"), 1.0]), "b": a["b"]}, a)
    assert "NaN" in reply_problem({"w": torch.tensor([float("inf"), 1.0]), "b": a["b"]}, a)
