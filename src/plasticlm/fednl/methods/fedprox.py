"""FedProx (Li et al., 2020): FedAvg plus a proximal term that keeps each client's local
theta near the global one, (mu/2) ||w - w_global||^2."""

from __future__ import annotations

from plasticlm.config import Field, configclass
from plasticlm.fednl.methods.base import FedMethod
from plasticlm.fednl.objective import LocalObjective
from plasticlm.fednl.registries import FEDERATED_METHODS


@configclass
class FedProxConfig:
    """FedProx's knobs (``method.fedprox.*``)."""

    mu: float = Field(0.01, ge=0, description="weight of (mu/2)||w - w_global||^2")


class Proximal(LocalObjective):
    """(mu/2) sum_n ||p_n - global_n||^2 over theta's entries."""

    def __init__(self, global_theta: dict, mu: float):
        self.global_theta, self.mu = global_theta, mu

    def penalty(self, params):
        return self.mu / 2 * sum(((p.float() - self.global_theta[n]) ** 2).sum()
                                 for n, p in params.items())


@FEDERATED_METHODS.register("fedprox")
class FedProx(FedMethod):
    """FedAvg plus (mu/2)||w - w_global||^2 in the local objective."""

    def objective(self, params, global_theta, state, cfg):
        return Proximal(global_theta, cfg.fedprox.mu)
