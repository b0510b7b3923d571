"""Every registry walked: each member runs once and does what its extension point promises,
and every class written as a member is registered. One section per method."""

import math

import pytest
import torch
from torch import nn

from plasticlm.config import from_dict, load_config
from plasticlm.errors import PlasticError

# ---------------------------------------------------------------------------------------------
# FedRefine: modes (MODES), fuser kinds (FUSER_KINDS), fuser objectives (OBJECTIVES), cache
# quantisations (QUANTS)
# ---------------------------------------------------------------------------------------------

REFINE_TEXTS = ["Q: Which organ does Kalomira act on? A: liver.",
                "Q: Which company makes Zutorex? A: Orvane Labs.",
                "Doctors prescribe Kalomira for asthma. The main target of Zutorex is the heart."] * 4
REFINE_PROMPT = "Q: Which organ does Kalomira act on? A:"
REFINE_CHOICES = ["liver", "heart", "lung"]


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def _open(fuser, seed: int = 0):
    """Random weights and open gates: an untrained fuser leaves the receiver's cache as it
    is, so give it something to say."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in fuser.named_parameters():
            if "gate" in name:
                p.fill_(2.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return fuser.eval()


@pytest.fixture(scope="module")
def refine_peers():
    """The refine tests' tiny pair: a Qwen3 receiver and a Llama transmitter of other depth,
    heads, head dim and vocabulary."""
    from plasticlm.models import build_tiny, train_bpe_tokenizer
    from plasticlm.refine import Peer

    rt = train_bpe_tokenizer(REFINE_TEXTS, vocab_size=300)
    tt = train_bpe_tokenizer(REFINE_TEXTS[:6], vocab_size=280)
    r = build_tiny("qwen3", seed=0, vocab_size=len(rt), hidden_size=32, num_layers=3,
                   num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64)
    t = build_tiny("llama", seed=1, vocab_size=len(tt), hidden_size=48, num_layers=4,
                   num_heads=4, num_kv_heads=2, head_dim=12, intermediate_size=64)
    return Peer("r", r, rt), Peer("t", t, tt)


@pytest.mark.usefixtures("one_thread")
def test_refine_every_mode_scores_the_choices_and_answers(refine_peers):
    from plasticlm.refine import MODES, FedRefine, Fuser, Link, RefineConfig
    from plasticlm.refine.modes import Mode

    assert _subclasses(Mode) == {m for _, m in MODES.items()}, "a Mode class is unregistered"
    r, t = refine_peers
    links = [Link(t, _open(Fuser.for_pair(r.layout, t.layout, hidden=8), 1)),
             Link(t, _open(Fuser.for_pair(r.layout, t.layout, kind="lowrank", rank=4), 2))]
    fr = FedRefine(r, links, RefineConfig(t2t_max_new_tokens=2),
                   reverse_fuser=_open(Fuser.for_pair(t.layout, r.layout, hidden=8), 3))
    alone = FedRefine(r).score(REFINE_PROMPT, REFINE_CHOICES, "alone").scores
    for name, mode in MODES.items():
        s = fr.score(REFINE_PROMPT, REFINE_CHOICES, name)
        assert len(s.scores) == len(REFINE_CHOICES), name
        assert all(math.isfinite(x) and x < 0 for x in s.scores), name
        assert s.scores[s.choice] == max(s.scores) and 0 < s.ttft <= s.latency, name
        # a mode that uses transmitters sends bytes and changes what the receiver thinks
        assert (s.wire_bytes > 0) == mode.uses_links, name
        assert (s.scores != alone) == mode.uses_links, name
        assert fr.links_for(name) == (mode.links(links, None) if mode.uses_links else [])
        a = fr.ask(REFINE_PROMPT, name, max_new_tokens=2)
        assert isinstance(a.text, str) and a.wire_bytes == s.wire_bytes, name


@pytest.mark.usefixtures("one_thread")
def test_refine_every_fuser_kind_maps_a_cache_to_the_receivers_shape(refine_peers, tmp_path):
    from plasticlm.refine import FUSER_KINDS, Fuser, extract_cache
    from plasticlm.refine.fusers import fuser_layers

    written = {c for c in vars(fuser_layers).values()
               if isinstance(c, type) and issubclass(c, nn.Module) and hasattr(c, "from_config")}
    assert written == {k for _, k in FUSER_KINDS.items()}, "a fuser kind is unregistered"
    r, t = refine_peers
    g = torch.Generator().manual_seed(0)
    own, _ = extract_cache(r.model, torch.randint(4, 200, (2, 6), generator=g))
    sent, _ = extract_cache(t.model, torch.randint(4, 200, (2, 9), generator=g))
    index = torch.randint(0, 9, (2, 6), generator=g)
    for kind in FUSER_KINDS:
        fresh = Fuser.for_pair(r.layout, t.layout, kind=kind, rank=4, hidden=8).eval()
        assert len(fresh.layers) == r.layout.num_layers
        for a, b in zip(fresh.fuse_aligned(own, sent, index).keys, own.keys):
            torch.testing.assert_close(a, b)      # zero output maps: the receiver unchanged
        fuser = _open(fresh)
        fused = fuser.fuse_aligned(own, sent, index)
        assert [k.shape for k in fused.keys] == [k.shape for k in own.keys], kind
        assert [v.shape for v in fused.values] == [v.shape for v in own.values], kind
        assert any(not torch.equal(a, b) for a, b in zip(fused.keys, own.keys)), kind
        pre = fuser.prefix(sent, r.layout, start=1)
        assert pre.keys[0].shape == (2, r.layout.num_kv_heads, 8, r.layout.head_dim), kind
        gates = fuser.gates_on()
        assert set(gates) == {"keys", "values"}
        assert all(0 <= i < r.layout.num_layers for i in gates["keys"] + gates["values"])
        back = Fuser.from_pretrained(fuser.save_pretrained(tmp_path / kind), device="cpu")
        assert back.config == fuser.config
        for a, b in zip(back.fuse_aligned(own, sent, index).keys, fused.keys):
            torch.testing.assert_close(a, b)


def _transmission(layers=3, heads=2, tokens=5, dim=8, seed=0):
    from plasticlm.refine.cache import KVCache, KVLayout
    from plasticlm.refine.peer import Transmission, text_digest

    g = torch.Generator().manual_seed(seed)
    layout = KVLayout("llama", layers, heads, dim, torch.rand(dim // 2, generator=g))
    keys = [torch.randn(1, heads, tokens, dim, generator=g) * 3 for _ in range(layers)]
    values = [torch.randn(1, heads, tokens, dim, generator=g) for _ in range(layers)]
    cache = KVCache(layout, keys, values, torch.randint(0, 500, (1, tokens), generator=g),
                    torch.arange(tokens)[None], torch.ones(1, tokens, dtype=torch.long), "t")
    return Transmission(cache, list(range(1, tokens + 1)), tokens, list(range(layers)),
                        text_digest("a prompt"))


def test_refine_every_fuser_objective_trains_a_step(refine_peers):
    """Each fuser objective (OBJECTIVES) takes one finite training step; the cache ones with
    a teacher of the receiver's architecture and tokenizer (here the receiver itself), the
    choice ones on items with choices, the entity one on items naming their entity."""
    import math

    from plasticlm.refine import Example, FuserTrainConfig, train_fuser
    from plasticlm.refine.fusers.objectives import OBJECTIVES, needs_teacher

    receiver, transmitter = refine_peers
    examples = [Example("Q: Which organ does Ofloxin act on? A:", " liver",
                        choices=("liver", "heart"), entity="Ofloxin"),
                Example("Q: Which organ does Renalix act on? A:", " kidney",
                        choices=("kidney", "lung"), entity="Renalix")]
    for name in OBJECTIVES:
        cfg = FuserTrainConfig(objective=name, epochs=1, batch_size=2, hidden=16)
        _, losses = train_fuser(receiver, transmitter, examples, cfg, progress=False,
                                teacher=receiver if needs_teacher(name) else None)
        assert len(losses) == 1 and math.isfinite(losses[0]), name


def test_refine_every_quantisation_round_trips_within_its_tolerance():
    """Error per element at most half a step of the stored type: relative (eps/2) for floats,
    plus half a scale step for scaled kinds (keys scaled per channel, values per token; the
    bf16 scale rounded up by < 2^-6), plus half the smallest subnormal step."""
    from plasticlm.refine.wire.codec import decode_bundle, encode_bundle
    from plasticlm.refine.wire.quant import QUANTS, Quant

    concrete = {c for c in _subclasses(Quant) if "stored" in vars(c)}
    assert concrete == {q for _, q in QUANTS.items()}, "a quantisation is unregistered"
    tr = _transmission()
    full = len(encode_bundle([tr], quant="float32"))
    for name, q in QUANTS.items():
        payload = encode_bundle([tr], quant=name)
        assert len(payload) <= full, name
        _, (back,) = decode_bundle(payload)
        floating = q.stored.is_floating_point
        info = torch.finfo(q.stored) if floating else None
        for kind, per in (("keys", 2), ("values", 3)):
            for a, b in zip(getattr(tr.cache, kind), getattr(back.cache, kind)):
                step = a.abs().amax(dim=per, keepdim=True) / q.top * (1 + 2**-6) \
                    if q.scaled else torch.ones(())
                bound = (info.eps / 2 * a.abs() + step * info.smallest_normal * info.eps / 2
                         if floating else 0.5 * step)
                assert ((a - b).abs() <= bound * (1 + 1e-5)).all(), (name, kind)
                if name == "float32":
                    assert torch.equal(a, b)


def test_refine_registry_typos_are_refused_with_the_choices(capsys):
    from plasticlm.cli import main
    from plasticlm.refine import FUSER_KINDS, MODES, QUANTS
    from plasticlm.refine.fusers.train import FuserTrainConfig
    from plasticlm.refine.wire.serving import ServiceConfig

    with pytest.raises(PlasticError, match=f"config kind: unknown fuser kind 'c2d'; choose one "
                       f"of {', '.join(FUSER_KINDS)}"):
        load_config(FuserTrainConfig, None, ["kind=c2d"])
    with pytest.raises(PlasticError, match=f"config quant: unknown cache quantisation 'int4'; "
                       f"choose one of {', '.join(QUANTS)}"):
        from_dict(ServiceConfig, {"quant": "int4"})
    assert main(["refine", "ask", "hi", "--receiver", "nowhere", "--mode", "c2x"]) == 2
    err = capsys.readouterr().err
    assert f"unknown FedRefine mode 'c2x'; choose one of {', '.join(MODES)}" in err


# ---------------------------------------------------------------------------------------------
# FedNL: federated methods (FEDERATED_METHODS), aggregation rules (AGGREGATORS)
# ---------------------------------------------------------------------------------------------

FEDNL_ONE_STEP = ["train.local_steps=1", "train.batch_size=2", "data.max_train=4",
                  "data.max_test=2", "method.fedala.steps=1", "train.lr=1e-2", "train.full_lr=1e-2"]


@pytest.mark.usefixtures("one_thread")
def test_fednl_every_method_runs_a_local_round_on_the_quick_model():
    """Each registered method prepares the quick receiver, trains one local step from the
    initial theta and returns a finite loss and a theta that moved (same keys, float32)."""
    from plasticlm.config import preset_path
    from plasticlm.fednl.build import build_model, tasks_for
    from plasticlm.fednl.config import FedNLConfig
    from plasticlm.fednl.local_round import local_update
    from plasticlm.fednl.methods import FedMethod
    from plasticlm.fednl.registries import FEDERATED_METHODS
    from plasticlm.fednl.theta import get_theta

    assert {FedMethod} | _subclasses(FedMethod) == {m for _, m in FEDERATED_METHODS.items()}, \
        "a FedMethod class is unregistered"
    for name in FEDERATED_METHODS.names():
        cfg = load_config(FedNLConfig, None, [f"method.name={name}", *FEDNL_ONE_STEP],
                          preset=preset_path("fednl", "quick"))
        model, tok = build_model(cfg)
        start = {k: v.clone() for k, v in get_theta(model).items()}
        theta, metrics = local_update(model, tok, tasks_for(cfg)[0], start, {}, cfg, seed=0)
        assert set(theta) == set(start), name
        assert all(v.dtype == torch.float32 for v in theta.values()), name
        assert math.isfinite(metrics["train_loss"]) and metrics["train_loss"] > 0, name
        assert any(not torch.equal(theta[k], start[k]) for k in theta), name


def _fednl_honest(n: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    current = {"a": torch.randn(4, 3, generator=gen), "gate_logit": torch.zeros(2)}
    thetas = [{k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in current.items()}
              for _ in range(n)]
    return current, thetas


def test_fednl_every_aggregation_rule_stays_within_the_clients():
    """Each registered rule maps 5 honest replies to a theta inside their coordinate-wise
    range (and none is clipped)."""
    from plasticlm.fednl.aggregators import robust_aggregate
    from plasticlm.fednl.config_sections import AggregationConfig
    from plasticlm.fednl.registries import AGGREGATORS

    current, thetas = _fednl_honest()
    for rule in AGGREGATORS.names():
        out, info = robust_aggregate(thetas, [10, 20, 30, 40, 50], current,
                                     AggregationConfig(rule=rule), max_examples=96)
        assert info["clipped"] == [] and info["rule"] == rule
        for k in current:
            stack = torch.stack([t[k] for t in thetas])
            assert (out[k] >= stack.min(0).values - 1e-6).all(), (rule, k)
            assert (out[k] <= stack.max(0).values + 1e-6).all(), (rule, k)


def _fednl_replies(thetas, counts):
    """The clients' replies as Flower's strategies receive them: one ArrayRecord and one
    MetricRecord with the example count."""
    from flwr.app import ArrayRecord, Message, MessageType, Metadata, MetricRecord, RecordDict

    return [Message(metadata=Metadata(run_id=1, message_id=f"m{i}", src_node_id=i + 1,
                                      dst_node_id=0, reply_to_message_id=f"r{i}", group_id="1",
                                      created_at=0.0, ttl=60.0,
                                      message_type=MessageType.TRAIN),
                    content=RecordDict({"arrays": ArrayRecord(
                        {k: v.clone() for k, v in theta.items()}),
                        "metrics": MetricRecord({"num-examples": n})}))
            for i, (theta, n) in enumerate(zip(thetas, counts))]


@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "krum"])
def test_fednl_robust_rules_equal_flowers_strategies(rule):
    """With clipping off, median, trimmed_mean and krum give what Flower's FedMedian,
    FedTrimmedAvg and Krum give on the same replies (ours aggregate the updates
    theta_i - theta, Flower's the thetas: the same for these rules)."""
    from flwr.serverapp.strategy import FedMedian, FedTrimmedAvg, Krum

    from plasticlm.fednl.aggregators import robust_aggregate
    from plasticlm.fednl.config_sections import AggregationConfig

    current, thetas = _fednl_honest(5, seed=3)
    thetas[4] = {k: v + 5.0 for k, v in thetas[4].items()}   # one far client: rules differ
    counts = [10, 20, 30, 40, 50]
    cfg = AggregationConfig(rule=rule, clip=0.0)
    ours, _ = robust_aggregate(thetas, counts, current, cfg, max_examples=96)
    flower = {"median": FedMedian(), "trimmed_mean": FedTrimmedAvg(beta=cfg.trim),
              "krum": Krum(num_malicious_nodes=(len(thetas) - 3) // 2)}[rule]
    arrays, _ = flower.aggregate_train(1, _fednl_replies(thetas, counts))
    theirs = arrays.to_torch_state_dict()
    assert set(theirs) == set(ours)
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k].float(), atol=1e-5, rtol=1e-5)
    # and not what the plain mean gives
    mean, _ = robust_aggregate(thetas, counts, current, AggregationConfig(rule="mean", clip=0.0),
                               max_examples=96)
    assert max(float((mean[k] - ours[k]).abs().max()) for k in ours) > 0.1


# ---------------------------------------------------------------------------------------------
# SCoL: the methods compared (SCOL_METHODS), layer selections (SELECTIONS), rewards (REWARDS)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scol_tiny(one_thread, drug_passages, tiny_squad_world):
    """The SCoL tests' tiny Qwen3 (4 layers) and BPE tokenizer, and three contexts with two
    closed-book questions each."""
    from plasticlm.scol.contexts import contexts_from_passages

    passages = drug_passages[:3]
    _, model, tok = tiny_squad_world(passages, "scol_registries", ["layers: 0, 1, 2, 3"] * 3,
                                     num_layers=4, max_position_embeddings=512)
    return model, tok, contexts_from_passages(passages)


def _scol_config(**scol):
    from plasticlm.experiments.scol.setup import ExperimentConfig

    return from_dict(ExperimentConfig, {
        "prompt_tokens": 64, "scol": {"k": 3, "temperature": 2.0, "reward": "intrinsic",
                                      "outer_steps": 1, "ipo_epochs": 1,
                                      "lora": {"steps": 1, "lr": 1e-2, "replay": 0}, **scol}})


def test_scol_every_method_fills_its_accuracy_matrix(scol_tiny, tmp_path):
    """Each method of the squad experiment, prepared on a training stream and started from
    its meta-trained policy, fills the lower-triangular accuracy matrix of the evaluation
    stream; a method that commits updates returns one record per context, on its layers."""
    from plasticlm.scol.baselines import SCOL_METHODS, Method
    from plasticlm.scol.matrix import AccuracyMatrix
    from plasticlm.scol.meta import meta_train

    labelled = {c for c in _subclasses(Method) if "label" in vars(c)}
    assert labelled == {m for _, m in SCOL_METHODS.items()}, "a SCoL method is unregistered"
    model, tok, contexts = scol_tiny
    train, stream = [contexts[:1]], contexts[1:]
    cfg = _scol_config()
    policies: dict = {}
    for _, method in SCOL_METHODS.items():
        if method.policy and method.policy not in policies:
            policies[method.policy] = meta_train(model, tok, train,
                                                 SCOL_METHODS[method.policy].meta_config(cfg),
                                                 tmp_path / method.policy, progress=False)
        if method.prepare is not None:
            method.prepare(model, tok, train, cfg, None, policies, {})
    assert 0 <= policies["best_layer"] < 4
    for name, method in SCOL_METHODS.items():
        assert method.label and set(method.paper) <= {"immediate", "retention"}, name
        mat = AccuracyMatrix(stream)
        records = method.run(name, mat, model, policies, tok, stream, cfg, None)
        assert [len(row) for row in mat.em] == [1, 2] and None not in mat.em[-1], name
        assert all(0 <= x <= 1 for row in mat.em + mat.f1 for x in row if x is not None), name
        if records is not None:
            assert [r.index for r in records] == [0, 1], name
            assert all(r.layers and set(r.layers) <= set(range(4)) for r in records), name
    assert SCOL_METHODS["fixed_last"].layers(model, policies) == (3,)
    assert SCOL_METHODS["fixed_best"].layers(model, policies) == (policies["best_layer"],)


def test_scol_every_selection_commits_one_of_its_candidates(scol_tiny):
    """Each selection rule proposes candidates and commits one of them per context; a scored
    rule commits the candidate its ``choose`` picks from the rewards (the first best)."""
    from plasticlm.scol.selections import SELECTIONS, Selection
    from plasticlm.scol.stream import consolidate_stream

    assert _subclasses(Selection) == {s for _, s in SELECTIONS.items()}, \
        "a SCoL selection is unregistered"
    model, tok, contexts = scol_tiny
    cfg = _scol_config().scol
    for name, rule in SELECTIONS.items():
        _, records, pairs = consolidate_stream(model, tok, contexts[:2], cfg, name, layers=(2, 1))
        assert len(records) == 2, name
        for r in records:
            layer_sets = [tuple(c["layers"]) for c in r.candidates]
            assert r.layers in layer_sets and set(r.layers) <= set(range(4)), name
            if rule.scored:
                totals = [c["reward"]["total"] for c in r.candidates]
                assert math.isfinite(r.reward.total), name
                assert layer_sets[rule.choose(totals)] == r.layers, name
            else:
                assert len(layer_sets) == 1 and r.reward is None and not pairs, name
    assert SELECTIONS["best"].choose([0.1, 0.7, 0.7, -1.0]) == 1
    _, fixed, _ = consolidate_stream(model, tok, contexts[:1], cfg, "fixed", layers=(2, 1))
    _, every, _ = consolidate_stream(model, tok, contexts[:1], cfg, "all")
    assert fixed[0].layers == (1, 2) and every[0].layers == (0, 1, 2, 3)


def _scol_taught(model, tok, texts: list[str], steps: int = 100):
    """A copy of ``model`` fine-tuned on ``texts`` until it recites them."""
    import copy

    taught = copy.deepcopy(model).train()
    batch = tok(texts, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    opt = torch.optim.AdamW(taught.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = taught(**batch, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return taught.eval()


def test_scol_every_reward_ranks_learning_the_context_above_learning_something_else(scol_tiny):
    """Each reward is finite, is zero-forgetting for the untouched model, and ranks a model
    taught the context (its text and its questions' right answers) above one taught another
    context (its text and wrong answers to this context's questions)."""
    from plasticlm.eval import qa_continuation
    from plasticlm.scol.rewards import REWARDS, RewardProbe, qa_prompt

    assert _subclasses(RewardProbe) == {r for _, r in REWARDS.items()}, \
        "a SCoL reward is unregistered"
    model, tok, contexts = scol_tiny
    own, other = contexts[1], contexts[2]
    right = [own.text] + [qa_prompt(q.question) + qa_continuation(q.answers[0])
                          for q in own.questions]
    wrong = [other.text] + [qa_prompt(q.question) + qa_continuation(o.answers[0])
                            for q, o in zip(own.questions, other.questions)]
    taught, mistaught = _scol_taught(model, tok, right), _scol_taught(model, tok, wrong)
    for name in REWARDS:
        cfg = _scol_config(reward=name, lam=1.0, forget_window=1).scol
        probe = REWARDS[name](model, tok, contexts[:2], 1, cfg)
        same, good, bad = probe(model), probe(taught), probe(mistaught)
        assert all(math.isfinite(x) for r in (same, good, bad)
                   for x in (r.acquisition, r.forgetting, r.total)), name
        assert same.forgetting == pytest.approx(0.0, abs=1e-6), name
        assert good.total > bad.total and good.acquisition > same.acquisition, name


def test_scol_config_typos_are_refused_with_the_choices(scol_tiny, capsys):
    from plasticlm.cli import main
    from plasticlm.experiments.scol.calibrate import SweepConfig
    from plasticlm.experiments.scol.setup import ExperimentConfig
    from plasticlm.scol.baselines import SCOL_METHODS
    from plasticlm.scol.rewards import REWARDS
    from plasticlm.scol.selections import SELECTIONS
    from plasticlm.scol.stream import consolidate_stream

    with pytest.raises(PlasticError, match=f"config methods.1: unknown SCoL method 'scoll'; "
                       f"choose one of {', '.join(SCOL_METHODS)}"):
        load_config(ExperimentConfig, None, ['methods=["scol","scoll"]'])
    with pytest.raises(PlasticError, match=f"config scol.reward: unknown SCoL reward "
                       f"'supervisd'; choose one of {', '.join(REWARDS)}"):
        load_config(ExperimentConfig, None, ["scol.reward=supervisd"])
    with pytest.raises(PlasticError, match="config scol.forget_from: input should be 'recent' "
                       "or 'all', got 'oldest'"):
        load_config(ExperimentConfig, None, ["scol.forget_from=oldest"])
    with pytest.raises(PlasticError, match=r"config scol.kk: unknown key \(known: .*k, "):
        load_config(ExperimentConfig, None, ["scol.kk=3"])
    with pytest.raises(PlasticError, match="config preset: input should be 'sandbox', "
                       "'quick', .* got 'quik'"):
        load_config(ExperimentConfig, None, ["preset=quik"])
    with pytest.raises(PlasticError, match="config layers: input should be 'random' or 'last'"):
        load_config(SweepConfig, None, ["layers=first"])
    with pytest.raises(PlasticError, match="config modules.0: input should be 'attention', "
                       "'mlp' or 'all'"):
        load_config(SweepConfig, None, ['modules=["mlpp"]'])
    model, tok, contexts = scol_tiny
    with pytest.raises(PlasticError, match=f"unknown SCoL selection 'bets'; choose one of "
                       f"{', '.join(SELECTIONS)}"):
        consolidate_stream(model, tok, contexts[:1], _scol_config().scol, "bets")
    assert main(["scol", "experiment", "squad", "--set", "scol.reward=likelihood"]) == 2
    assert f"unknown SCoL reward 'likelihood'; choose one of {', '.join(REWARDS)}" in \
        capsys.readouterr().err
