"""One client's local round, the same for every method: start from the method's initial theta,
train on the client's batches with the method's objective, keep the method's personal state."""

from __future__ import annotations

import torch

from plasticlm.fednl.methods import METHODS, MethodConfig, check_method
from plasticlm.fednl.objective import answer_loss, param_groups
from plasticlm.fednl.theta import get_theta, set_theta, trainable


def local_update(model, tokenizer, task, global_theta: dict, state: dict, cfg: MethodConfig,
                 seed: int) -> tuple[dict, dict]:
    """One round of local training from ``global_theta``; returns (local theta, metrics).

    ``state`` (the client's personal tensors) is read and updated in place.
    """
    check_method(cfg.name)
    method = METHODS[cfg.name]
    batches = task.batches(tokenizer, cfg.local_steps + cfg.ala_steps, cfg.batch_size, seed)
    start = method.initial(model, global_theta, state, batches, cfg)
    set_theta(model, start)
    params = trainable(model)
    opt = torch.optim.AdamW(param_groups(params, cfg.gate_lr), lr=method.learning_rate(cfg),
                            weight_decay=0.0)
    objective = method.objective(params, global_theta, state, cfg)

    model.train()
    losses = []
    for step, (ids, labels) in enumerate(batches):
        if step >= cfg.local_steps:
            break
        task_loss = answer_loss(model, ids, labels)
        extra = objective.penalty(params)
        loss = task_loss if extra is None else task_loss + extra
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        objective.before_step(params)
        opt.step()
        objective.after_step(params)
        losses.append(task_loss.item())
    model.eval()

    theta = get_theta(model)
    objective.finish(theta, start, state)
    method.keep(theta, state)
    return theta, {"train_loss": sum(losses) / max(1, len(losses)),
                   "train_loss_first": losses[0] if losses else float("nan"),
                   "train_loss_last": losses[-1] if losses else float("nan")}
