"""Each method's client update and the aggregation, directly (no Flower engine)."""

import pytest
import torch

from plasticlm.config import override
from plasticlm.data.records import MCQuestion
from plasticlm.errors import PlasticError
from plasticlm.eval import qa_line
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.config_sections import TrainConfig
from plasticlm.fednl.local_round import local_update
from plasticlm.fednl.methods import FEDERATED_METHODS, prepare_model
from plasticlm.fednl.replies import reply_problem, weighted_mean
from plasticlm.fednl.task import ClientTask
from plasticlm.fednl.theta import get_theta, set_theta, trainable
from plasticlm.models import build_tiny, pack_corpus, train_bpe_tokenizer, train_lm

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


_BASE: dict = {}


def _base(tok):
    """A tiny base pre-trained on every question with every choice: it knows the format and
    the four candidates (answer loss ~ln 4) but not which one this client's data says."""
    if "state" not in _BASE:
        torch.manual_seed(0)
        model = build_tiny("qwen3", vocab_size=len(tok), hidden_size=32, num_layers=2,
                           num_heads=2, num_kv_heads=1)
        blocks = pack_corpus(tok, [qa_line(q, c) for q, cs in FACTS for c in cs] * 8, 32)
        train_lm(model, blocks, 120, batch_size=8, lr=1e-2, warmup=10, progress=False)
        _BASE["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    model = build_tiny("qwen3", vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2,
                       num_kv_heads=1)
    model.load_state_dict(_BASE["state"])
    return model


def run_config(method: str, changes: dict | None = None) -> FedNLConfig:
    """The tests' run config of ``method`` with dotted-key ``changes``: fednl reads beyond
    its 8-token window through the memory; the baselines attend fully."""
    window = 8 if method.startswith("fednl") else 0
    return override(FedNLConfig(), {
        "method.name": method, "method.window": window, "method.fedala.steps": 2,
        "train.local_steps": 6, "train.batch_size": 4, "train.lr": 1e-2,
        "train.full_lr": 1e-2, **(changes or {})})


def fresh(method: str, tok, changes: dict | None = None):
    cfg = run_config(method, changes)
    torch.manual_seed(0)
    model = _base(tok)
    return prepare_model(model, cfg.method, cfg.memory), cfg


def test_unknown_method_is_rejected(tok):
    with pytest.raises(PlasticError, match="unknown federated method 'fedsgd'; choose one of"):
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


def _three_rounds(method, tok, task, changes: dict | None = None):
    model, cfg = fresh(method, tok, changes)
    start = get_theta(model)
    acc0 = task.accuracy(model, tok)
    state, theta, first = {}, start, None
    for r in range(3):
        theta, metrics = local_update(model, tok, task, theta, state, cfg, seed=r)
        first = metrics["train_loss_first"] if first is None else first
    return model, start, theta, acc0, task.accuracy(model, tok), first, metrics["train_loss_last"]


# fednl-personal trains locally exactly as fednl does (it differs in what it sends and keeps:
# tests/fednl/test_fednl_personal.py), so it is not trained here a second time
@pytest.mark.parametrize("method", [m for m in FEDERATED_METHODS.names() if m != "fednl-personal"])
def test_local_update_learns_the_clients_answers(method, tok, task):
    """The base knows the four candidates of each question but not the client's answer:
    three local rounds lower the answer loss and lift accuracy above the base's; at
    lr = 1e-9 neither happens, so the check measures learning, not the passage of steps."""
    model, start, theta, acc0, acc, first, last = _three_rounds(method, tok, task)
    assert set(theta) == set(start)
    assert last < first - 0.05, (first, last)
    assert acc > acc0 and acc >= 0.75, (acc0, acc)
    if method in ("fednl", "fedavg"):
        *_, acc0_, acc_, first_, last_ = _three_rounds(
            method, tok, task, {"train.lr": 1e-9, "train.gate_lr": 1e-9,
                                "train.full_lr": 1e-9})
        assert acc_ == acc0_ and not last_ < first_ - 0.05


@pytest.mark.parametrize("method", FEDERATED_METHODS.names())
def test_a_round_on_a_bfloat16_base_trains_float32_theta(method, tok, task):
    """--dtype bfloat16: the frozen base in bfloat16, theta (memory, LoRA) trained in float32
    and sent as float32 CPU tensors; fedavg-full, which trains every weight, keeps float32.
    Two rounds with personal state (FedALA, FedSSI) run and learn."""
    cfg = run_config(method)
    torch.manual_seed(0)
    model = prepare_model(_base(tok).to(torch.bfloat16), cfg.method, cfg.memory)
    base_dtype = next(model.parameters()).dtype
    assert base_dtype == (torch.float32 if method == "fedavg-full" else torch.bfloat16)
    assert {p.dtype for p in trainable(model).values()} == {torch.float32}
    state, theta, losses = {}, get_theta(model), []
    for r in range(2):
        theta, metrics = local_update(model, tok, task, theta, state, cfg, seed=r)
        losses += [metrics["train_loss_first"], metrics["train_loss_last"]]
    assert all(v.dtype == torch.float32 and v.device.type == "cpu"
               for v in [*theta.values(), *state.values()])
    assert losses[-1] < losses[0], losses
    assert 0.0 <= task.accuracy(model, tok) <= 1.0


def test_the_memory_gate_opens_within_the_default_budget(tok, task):
    """With the default gate learning rate one local round moves some gate logit by > 0.1
    (at the LoRA rate, 2e-3, Adam moved it by < 0.1 in a whole run); the budget check warns
    when a configuration cannot move the gate."""
    default = TrainConfig()
    model, cfg = fresh("fednl", tok, {"train.lr": default.lr, "train.gate_lr": default.gate_lr,
                                      "train.local_steps": default.local_steps})
    start = get_theta(model)
    theta, _ = local_update(model, tok, task, start, {}, cfg, seed=0)
    moved = max((theta[k] - start[k]).abs().max().item() for k in start if k.endswith("gate_logit"))
    assert moved > 0.1
    assert override(FedNLConfig(), {"train.rounds": 4}).gate_warning() is None
    assert "gate can move by at most" in override(
        FedNLConfig(), {"train.rounds": 4, "train.gate_lr": 2e-3}).gate_warning()


def test_fedprox_stays_closer_to_the_global_theta(tok, task):
    far = {}
    for mu in (0.0, 100.0):
        model, cfg = fresh("fedprox", tok, {"method.fedprox.mu": mu})
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


def test_fedala_client_update_takes_a_list_of_batches_as_the_generator(tok, task):
    """The library call (a list of batches, no run config) gives FedALA's round exactly what
    the run's generator gives it: its weights learnt on the first ``fedala.steps`` batches."""
    from plasticlm.fednl.local_round import client_update

    results = []
    for as_list in (False, True):
        model, cfg = fresh("fedala", tok)
        g, state = get_theta(model), {}
        local_update(model, tok, task, g, state, cfg, seed=0)      # round 1: keeps local theta
        g2 = {k: v + 0.01 for k, v in g.items()}
        batches = task.batches(tok, cfg.train.local_steps + cfg.method.fedala.steps,
                               cfg.train.batch_size, 1)
        theta, _ = client_update(model, list(batches) if as_list else batches, g2, state,
                                 cfg.method, cfg.train)
        results.append(theta)
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


def test_fedala_answers_with_its_personalised_model():
    """FedALA's client answers (is scored) with the global theta mixed into its last local
    theta by its learned weights, not with the global theta; before it has trained, global."""
    from plasticlm.fednl.methods import FedALA

    g = {"model.layers.1.q.lora_A": torch.full((2,), 4.0), "model.layers.0.q.lora_A": torch.ones(2)}
    assert FedALA().personalise(g, {}) is g
    state = {"local.model.layers.1.q.lora_A": torch.zeros(2),
             "local.model.layers.0.q.lora_A": torch.zeros(2),
             "ala.model.layers.1.q.lora_A": torch.tensor([0.25, 1.0])}
    mine = FedALA().personalise(g, state)
    assert mine["model.layers.1.q.lora_A"].tolist() == [1.0, 4.0]
    assert torch.equal(mine["model.layers.0.q.lora_A"], g["model.layers.0.q.lora_A"])


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


def test_fedssi_penalty_changes_the_second_round_and_vanishes_at_c_zero(tok, task):
    """From the second round on, FedSSI's synaptic-intelligence penalty pulls theta toward
    its anchor: the update differs from the same run without it (fedssi.c = 0), which equals
    plain FedAvg's update step for step."""
    def two_rounds(method: str, changes: dict | None = None):
        model, cfg = fresh(method, tok, changes)
        theta, state = get_theta(model), {}
        for r in range(2):
            theta, _ = local_update(model, tok, task, theta, state, cfg, seed=r)
        return theta

    ssi = two_rounds("fedssi", {"method.fedssi.c": 10.0})
    no_penalty = two_rounds("fedssi", {"method.fedssi.c": 0.0})
    fedavg = two_rounds("fedavg")
    assert all(torch.equal(no_penalty[k], fedavg[k]) for k in fedavg)
    assert max((ssi[k] - no_penalty[k]).abs().max().item() for k in ssi) > 1e-4


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


def test_segmented_training_is_the_parallel_loss_with_the_state_carried(tok, task):
    """Truncated BPTT (``segment_tokens``): the loss read segment by segment equals the
    parallel forward's (the window cache and memory are carried across segments, not
    reset); with one segment the gradient is the parallel one; with short segments the
    gradient is cut at the boundaries, so it differs."""
    from plasticlm.fednl.objective import answer_loss, segmented_answer_backward

    model, _ = fresh("fednl", tok)
    with torch.no_grad():  # an open gate and a nonzero LoRA B, so the memory carries something
        for name, p in trainable(model).items():
            if ".B" in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.3)
    ids, labels = next(task.batches(tok, 1, 4, seed=0))
    params = trainable(model)

    def grads():
        return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                for n, p in params.items()}

    model.zero_grad()
    parallel = answer_loss(model, ids, labels)
    parallel.backward()
    g_parallel = grads()
    for segment in (3, 5):
        model.zero_grad()
        loss = segmented_answer_backward(model, ids, labels, segment)
        assert loss == pytest.approx(parallel.item(), abs=1e-5), segment
        assert max((grads()[n] - g).abs().max().item() for n, g in g_parallel.items()) > 1e-4
    model.zero_grad()
    assert segmented_answer_backward(model, ids, labels, ids.shape[1]) == \
        pytest.approx(parallel.item(), abs=1e-5)
    for n, g in grads().items():
        torch.testing.assert_close(g, g_parallel[n], atol=1e-5, rtol=1e-4)


def test_local_rounds_learn_with_segments(tok, task):
    """Local training in 4-token segments (state carried, gradient truncated) still learns the
    client's answers, and at lr = 1e-9 it does not; segments need a windowed state."""
    *_, acc0, acc, first, last = _three_rounds("fednl", tok, task, {"train.segment_tokens": 8})
    assert last < first - 0.05 and acc > acc0, (first, last, acc0, acc)
    *_, acc0_, acc_, first_, last_ = _three_rounds(
        "fednl", tok, task, {"train.segment_tokens": 8, "train.lr": 1e-9, "train.gate_lr": 1e-9})
    assert acc_ == acc0_ and not last_ < first_ - 0.05
    with pytest.raises(PlasticError, match="segment"):
        run_config("fedavg", {"method.window": 0, "train.segment_tokens": 8})
    with pytest.raises(PlasticError, match="segment"):
        run_config("fednl", {"train.segment_tokens": -1})
