"""Tests that fail when SCoL breaks (issue 40): each names the breakage it catches, and each
was checked by making that breakage in the source.

1. IPO's reference re-copied from the policy at every outer step, though
   ``scol.ipo_reference = "initial"`` fixes it (test_ipo_reference_stays_the_initial_policy).
2. The experiment's SCoL row consolidated from the untouched model instead of the
   meta-trained policy (test_scol_row_starts_from_its_meta_trained_policy).
3. IPO's target 1/(2 tau) inverted to 2 tau or tau, in the loss or in the update
   (test_ipo_update_drives_h_to_one_over_two_tau); the loss's own formula is checked by hand
   in test_scol_training.py.
4. The lambda = 0 ablation meta-trained with lambda = 1, or its row run from another policy
   (test_lambda0_ablation_meta_trains_with_lambda_zero).
"""

import copy
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from plasticlm.config import override
from plasticlm.scol.action_scores import completion_logprob
from plasticlm.scol.config import SCoLConfig
from plasticlm.scol.consolidate import LoraTrainConfig
from plasticlm.scol.contexts import contexts_from_passages, split_streams
from plasticlm.scol.ipo import PreferencePair, ipo_update


@pytest.fixture(scope="module")
def tiny(tiny_squad_world, one_thread, drug_passages):
    """A 4-layer tiny model and its tokenizer, saved with a SQuAD file of six passages."""
    passages = drug_passages
    folder, model, tok = tiny_squad_world(passages, "scol_breakages", ["layers: 0, 1, 2, 3"] * 3,
                                          num_layers=4, max_position_embeddings=512)
    return model, tok, passages, folder


def _weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_ipo_reference_stays_the_initial_policy(tiny, tmp_path, monkeypatch):
    """Breakage 1: with ``ipo_reference = "initial"`` (the default) every outer step's IPO
    update scores against the policy from before meta-training, not a copy of the policy as
    it is at that step; the policy itself has moved by the last step (else the check would
    see no difference)."""
    import plasticlm.scol.meta as meta

    model, tok, passages, _ = tiny
    train, _ = split_streams(contexts_from_passages(passages), 1, 2, 2, seed=0)
    cfg = SCoLConfig(k=3, lora=LoraTrainConfig(steps=2), outer_steps=3, ipo_epochs=1,
                     ipo_lr=1e-3, reward="intrinsic", temperature=2.0)
    assert cfg.ipo_reference == "initial"
    initial = _weights(model)
    seen = []
    real = meta.ipo_update

    def spy(policy, reference, pairs, *args, **kw):
        seen.append((_weights(reference), _weights(policy), len(pairs)))
        return real(policy, reference, pairs, *args, **kw)

    monkeypatch.setattr(meta, "ipo_update", spy)
    meta.meta_train(copy.deepcopy(model), tok, train, cfg, tmp_path / "m", progress=False)
    assert len(seen) == 3 and seen[0][2] > 0                 # IPO had pairs from step 0
    assert not _same(seen[-1][1], initial)                   # the policy moved ...
    for step, (reference, _, _) in enumerate(seen):          # ... its reference did not
        assert _same(reference, initial), f"outer step {step}: reference is not the initial"


@pytest.mark.parametrize("tau", [0.25, 1.0])
def test_ipo_update_drives_h_to_one_over_two_tau(tiny, tau):
    """Breakage 3: IPO's fixed point is h = 1/(2 tau). Trained on one pair, the policy's
    margin over the reference settles at 1/(2 tau): 2 at tau = 0.25, 0.5 at tau = 1 (an
    inverted target, 2 tau or tau, lands at 0.5 / 0.25 or 2 / 1). h is computed here from
    the models' log-probs, and the update's reported loss is (h - 1/(2 tau))^2."""
    from plasticlm.eval import encode_with_bos

    model, tok, _, _ = tiny
    prompt = tuple(encode_with_bos(tok, "Which layers? "))
    chosen = tuple(tok("layers: 3", add_special_tokens=False)["input_ids"])
    rejected = tuple(tok("layers: 0, 1", add_special_tokens=False)["input_ids"])
    pair = PreferencePair(prompt, chosen, rejected, 1.0)
    policy = copy.deepcopy(model)
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-3, weight_decay=0.0)
    stats = ipo_update(policy, model, [pair], opt, tau=tau, epochs=50)

    def margin(m):
        with torch.no_grad():
            return float(completion_logprob(m, list(prompt), list(chosen))
                         - completion_logprob(m, list(prompt), list(rejected)))

    h = margin(policy) - margin(model)
    target = 1.0 / (2.0 * tau)
    assert h == pytest.approx(target, abs=0.1)
    assert stats["h_after"] == pytest.approx(h, abs=1e-4)
    assert stats["ipo_loss_before"] == pytest.approx(target ** 2, abs=1e-4)   # h starts at 0
    assert stats["ipo_loss_after"] == pytest.approx((stats["h_after"] - target) ** 2, abs=1e-6)


@pytest.fixture(scope="module")
def experiment_seed(tiny, tmp_path_factory):
    """One seed of the squad experiment with SCoL and the lambda = 0 ablation, meta-training
    for real; records what each meta-training was given and what its inner loop ran with,
    and the model each method's row starts consolidating from. Each returned policy gets a
    distinct mark, so that the rows' starting models say whose policy they are."""
    import plasticlm.experiments.scol.experiment as experiment
    import plasticlm.scol.baselines as baselines
    import plasticlm.scol.meta as meta
    from plasticlm.experiments.scol.setup import quick_config

    _, _, _, folder = tiny
    cfg = override(quick_config(), {
        "model": str(folder / "model"), "squad": str(folder / "squad.json"),
        "methods": ["scol", "scol_lambda0", "untrained_policy"], "held_out_pairs": False,
        "scol.reward": "intrinsic", "scol.k": 3, "scol.temperature": 2.0})
    assert cfg.scol.lam == 1.0
    got = {"meta_cfg": {}, "inner_lam": {}, "policy": {}, "start": {}}
    current = []
    real_meta, real_inner = experiment.meta_train, meta.consolidate_stream
    real_rows = baselines.consolidate_stream

    def spy_meta(policy, tok, streams, mcfg, out, **kw):
        name = Path(out).name.removeprefix("meta_")
        got["meta_cfg"][name] = mcfg
        current.append(name)
        trained = real_meta(policy, tok, streams, mcfg, out, **kw)
        with torch.no_grad():   # the mark: whose policy a row starts from
            trained.get_input_embeddings().weight[0, 0] += 0.5 * len(current)
        got["policy"][name] = _weights(trained)
        return trained

    def spy_inner(model, tok, stream, scfg, *args, **kw):
        got["inner_lam"].setdefault(current[-1], set()).add(scfg.lam)
        return real_inner(model, tok, stream, scfg, *args, **kw)

    def spy_rows(model, tok, stream, scfg, selection, **kw):
        got["start"][kw["desc"]] = _weights(model)
        return real_rows(model, tok, stream, scfg, selection, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(experiment, "meta_train", spy_meta)
        mp.setattr(meta, "consolidate_stream", spy_inner)
        mp.setattr(baselines, "consolidate_stream", spy_rows)
        mp.setattr(experiment, "plot_squad", lambda report, out: None)
        report = experiment.run_squad_seed(cfg, tmp_path_factory.mktemp("seed"), progress=False)
    return cfg, report, got


def test_scol_row_starts_from_its_meta_trained_policy(tiny, experiment_seed):
    """Breakage 2: the SCoL row consolidates the evaluation stream from the policy that
    meta-training returned, not from the untouched model (the untrained-policy row's start)."""
    model, _, _, _ = tiny
    _, report, got = experiment_seed
    assert {"scol", "untrained_policy"} <= set(report["methods"])
    assert _same(got["start"]["untrained_policy"], _weights(model))
    assert _same(got["start"]["scol"], got["policy"]["scol"])
    assert not _same(got["start"]["scol"], got["start"]["untrained_policy"])


def test_lambda0_ablation_meta_trains_with_lambda_zero(experiment_seed):
    """Breakage 4: the lambda = 0 ablation's policy meta-trains with lam = 0 (its config, and
    every inner loop of its meta-training), SCoL's with the configured lam = 1, the two
    otherwise alike; the ablation's row starts from its own policy, not SCoL's."""
    cfg, report, got = experiment_seed
    assert set(got["meta_cfg"]) == {"scol", "scol_lambda0"}
    assert got["meta_cfg"]["scol"] == cfg.scol and got["inner_lam"]["scol"] == {1.0}
    assert got["meta_cfg"]["scol_lambda0"] == replace(cfg.scol, lam=0.0)
    assert got["inner_lam"]["scol_lambda0"] == {0.0}
    assert "scol_lambda0" in report["methods"]
    assert _same(got["start"]["scol_lambda0"], got["policy"]["scol_lambda0"])
    assert not _same(got["start"]["scol_lambda0"], got["policy"]["scol"])
