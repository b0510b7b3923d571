"""One client's local round, the same for every method: start from the method's initial theta,
train on the client's batches with the method's objective, keep the method's personal state."""

from __future__ import annotations

import torch

from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.config_sections import MethodConfig, TrainConfig
from plasticlm.fednl.objective import answer_loss, param_groups, segmented_answer_backward
from plasticlm.fednl.registries import FEDERATED_METHODS
from plasticlm.fednl.theta import set_theta, trainable


def local_update(model, tokenizer, task, global_theta: dict, state: dict,
                 cfg: FedNLConfig, seed: int) -> tuple[dict, dict]:
    """One round of local training on ``task``'s batches for round ``seed``: the run's
    :func:`client_update` (``cfg.method``, ``cfg.train``)."""
    extra = FEDERATED_METHODS[cfg.method.name]().extra_batches(cfg.method)
    batches = task.batches(tokenizer, cfg.train.local_steps + extra, cfg.train.batch_size, seed)
    return client_update(model, batches, global_theta, state, cfg.method, cfg.train)


def client_update(model, batches, global_theta: dict, state: dict, method_cfg: MethodConfig,
                  train: TrainConfig) -> tuple[dict, dict]:
    """One client's round from ``global_theta``: the method's initial theta, ``train.local_steps``
    steps on ``batches`` with the method's objective; returns (the theta to send: the local
    theta less what the method keeps on the client, metrics). No run folder or data config.

    ``model``: prepared by :func:`plasticlm.fednl.prepare_model` for ``method_cfg``;
    ``batches``: an iterable of ``(ids, labels)``, each ``[B, T]`` long tensors, labels -100 where
    no loss is taken (``local_steps`` of them, plus the method's ``extra_batches``: FedALA
    learns its weights on ``method_cfg.fedala.steps`` more, drawn first); ``state``: the client's personal tensors, read and updated in
    place. The model is left holding the whole local theta.

    >>> theta, metrics = client_update(model, batches, get_theta(model), {},
    ...                                MethodConfig(name="fednl", window=16), TrainConfig())  # doctest: +SKIP
    """
    method = FEDERATED_METHODS[method_cfg.name]()
    batches = iter(batches)   # a list or a generator: FedALA draws its batches first
    # the round runs where the model is: theta, anchors and personal state join it there,
    # and go back to the CPU (the wire, the client's disk) at the end
    device = next(model.parameters()).device
    global_theta = _to(global_theta, device)
    state.update(_to(state, device))
    start = method.initial(model, global_theta, state, batches, method_cfg)
    set_theta(model, start)
    params = trainable(model)
    opt = torch.optim.AdamW(param_groups(params, train.gate_lr), lr=method.learning_rate(train),
                            weight_decay=0.0)
    objective = method.objective(params, global_theta, state, method_cfg)

    model.train()
    losses = []
    for step, (ids, labels) in enumerate(batches):
        if step >= train.local_steps:
            break
        opt.zero_grad(set_to_none=True)
        extra = objective.penalty(params)
        if train.segment_tokens and ids.shape[1] > train.segment_tokens + 1:
            task_loss = segmented_answer_backward(model, ids, labels, train.segment_tokens)
            if extra is not None:
                extra.backward()
        else:
            task = answer_loss(model, ids, labels)
            (task if extra is None else task + extra).backward()
            task_loss = task.item()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        objective.before_step(params)
        opt.step()
        objective.after_step(params)
        losses.append(task_loss)
    model.eval()

    theta = {n: p.detach().float().clone() for n, p in params.items()}
    objective.finish(theta, start, state)
    method.keep(theta, state)
    state.update(_to(state, "cpu"))
    return _to(method.shared(theta, global_theta), "cpu"), {"train_loss": sum(losses) / max(1, len(losses)),
                   "train_loss_first": losses[0] if losses else float("nan"),
                   "train_loss_last": losses[-1] if losses else float("nan")}


def _to(tensors: dict, device) -> dict:
    return {k: v.to(device) for k, v in tensors.items()}
