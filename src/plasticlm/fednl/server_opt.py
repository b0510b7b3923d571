"""Server-side optimisers (Reddi et al. 2021, "Adaptive Federated Optimization"), as
Flower's FedAvgM, FedAdam and FedYogi compute them: the round's aggregate step
``delta = aggregate - theta`` is a pseudo-gradient that the server's optimiser turns into the
step theta takes.

They work on the flat step vector :func:`plasticlm.fednl.aggregators.robust_aggregate`
computes, after the aggregation rule and before the step bound, so a refused round leaves
the optimiser's state as it was. The state (first and second moments) is checkpointed with
the round's theta, so a resumed run continues the same trajectory.

A new optimiser is one subclass here, decorated ``@SERVER_OPTIMIZERS.register("name")``.
"""

from __future__ import annotations

import math

import torch

from plasticlm.fednl.config_sections import AggregationConfig
from plasticlm.fednl.registries import SERVER_OPTIMIZERS

State = dict[str, torch.Tensor]


@SERVER_OPTIMIZERS.register("none")
class ServerOptimizer:
    """FedAvg: theta takes the aggregate step as it is."""

    def __init__(self, cfg: AggregationConfig):
        self.cfg = cfg

    def propose(self, delta: torch.Tensor, state: State, round_: int) -> tuple[torch.Tensor,
                                                                               State]:
        """(theta's step [P], the new state) from the aggregate step ``delta`` [P] of round
        ``round_`` (1-based) and the state after the previous round (``{}`` at first)."""
        return delta, state


@SERVER_OPTIMIZERS.register("avgm")
class FedAvgM(ServerOptimizer):
    """Server momentum (Hsu et al. 2019): m = mu m + delta (m = delta at first), step =
    lr m (Flower's FedAvgM, PyTorch's SGD momentum convention)."""

    def propose(self, delta, state, round_):
        m = delta if "m" not in state else self.cfg.server_momentum * state["m"] + delta
        return self.cfg.server_lr * m, {"m": m}


def _first_moment(delta: torch.Tensor, state: State, beta1: float) -> torch.Tensor:
    m = state.get("m", torch.zeros_like(delta))
    return beta1 * m + (1 - beta1) * delta


@SERVER_OPTIMIZERS.register("adam")
class FedAdam(ServerOptimizer):
    """m = b1 m + (1-b1) delta; v = b2 v + (1-b2) delta^2; step = eta_t m / (sqrt v + tau),
    eta_t = lr sqrt(1 - b2^(t+1)) / (1 - b1^(t+1)) (Flower's FedAdam bias correction)."""

    def propose(self, delta, state, round_):
        c = self.cfg
        m = _first_moment(delta, state, c.server_momentum)
        v = c.server_beta2 * state.get("v", torch.zeros_like(delta)) \
            + (1 - c.server_beta2) * delta ** 2
        eta = c.server_lr * math.sqrt(1 - c.server_beta2 ** (round_ + 1)) \
            / (1 - c.server_momentum ** (round_ + 1))
        return eta * m / (v.sqrt() + c.server_tau), {"m": m, "v": v}


@SERVER_OPTIMIZERS.register("yogi")
class FedYogi(ServerOptimizer):
    """As FedAdam, but v = v - (1-b2) delta^2 sign(v - delta^2) (v grows additively, never
    faster), and no bias correction (Flower's FedYogi)."""

    def propose(self, delta, state, round_):
        c = self.cfg
        m = _first_moment(delta, state, c.server_momentum)
        v = state.get("v", torch.zeros_like(delta))
        v = v - (1 - c.server_beta2) * delta ** 2 * torch.sign(v - delta ** 2)
        return c.server_lr * m / (v.sqrt() + c.server_tau), {"m": m, "v": v}
