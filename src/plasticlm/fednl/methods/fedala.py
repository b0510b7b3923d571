"""FedALA (Zhang et al., 2023): each round starts from the global theta mixed into the
client's previous local theta with element-wise weights learned on a few local batches."""

from __future__ import annotations

import torch

from plasticlm.config import Field, configclass
from plasticlm.fednl.methods.base import FedMethod, keep_local, previous_local
from plasticlm.fednl.objective import answer_loss
from plasticlm.fednl.registries import FEDERATED_METHODS
from plasticlm.fednl.theta import layer_of, set_theta, trainable


@configclass
class FedALAConfig:
    """FedALA's knobs (``method.fedala.*``)."""

    layers: int = Field(1, gt=0, description="top decoder layers that get element-wise weights")
    steps: int = Field(4, ge=0, description="batches to learn the weights on")
    lr: float = Field(1.0, gt=0, description="learning rate of the weights")


def ala_initialise(model, global_theta: dict, state: dict, batches, cfg: FedALAConfig) -> dict:
    """FedALA's adaptive local aggregation; returns the personalised initial theta.

    theta_hat = theta_local + (theta_global - theta_local) * W on the top ``cfg.layers``
    layers (W in [0,1], same shape as each theta entry, learned on ``batches``: ``(ids,
    labels)`` pairs of ``[B, T]``), plain theta_global below them. W is kept in ``state``.
    """
    local = previous_local(state)
    if not local:
        return dict(global_theta)  # first round: nothing personal yet
    layers = [x for x in (layer_of(n) for n in global_theta) if x is not None]
    top = set(range(max(layers) - cfg.layers + 1, max(layers) + 1)) if layers else set()
    weights = {n: state.get(f"ala.{n}", torch.ones_like(global_theta[n]))
               for n in global_theta if layer_of(n) in top}
    params = trainable(model)
    for ids, labels in batches:
        mixed = {n: (local[n] + (global_theta[n] - local[n]) * weights[n]) if n in weights
                 else global_theta[n] for n in global_theta}
        set_theta(model, mixed)
        model.zero_grad(set_to_none=True)
        answer_loss(model, ids, labels).backward()
        with torch.no_grad():
            for n, w in weights.items():
                g = params[n].grad
                if g is not None:
                    w.sub_(cfg.lr * g.float() * (global_theta[n] - local[n])).clamp_(0, 1)
    for n, w in weights.items():
        state[f"ala.{n}"] = w
    model.zero_grad(set_to_none=True)
    return {n: (local[n] + (global_theta[n] - local[n]) * weights[n]) if n in weights
            else global_theta[n] for n in global_theta}


@FEDERATED_METHODS.register("fedala")
class FedALA(FedMethod):
    """FedAvg whose round starts from the global theta mixed into the client's previous
    local theta with learned element-wise weights (:func:`ala_initialise`)."""

    def extra_batches(self, cfg):
        return cfg.fedala.steps

    def initial(self, model, global_theta, state, batches, cfg):
        return ala_initialise(model, global_theta, state,
                              [next(batches) for _ in range(cfg.fedala.steps)], cfg.fedala)

    def keep(self, theta, state):
        keep_local(theta, state)

    def personalise(self, global_theta, state):
        """FedALA scores each client's personalised model, as its paper does: the global theta
        mixed into the client's last local theta with its learned weights (the round-start
        mix, without learning the weights again), plain global below the ALA layers and
        before the client has trained."""
        local = previous_local(state)
        if not local:
            return global_theta
        return {n: local[n] + (g - local[n]) * state[f"ala.{n}"] if f"ala.{n}" in state else g
                for n, g in global_theta.items()}
