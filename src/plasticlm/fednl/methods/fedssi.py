"""FedSSI (the FedNL paper's continual-learning baseline): FedAvg with a synaptic-intelligence
penalty (Zenke et al., 2017) towards a surrogate anchor mixed from the client's previous
local theta and the global one."""

from __future__ import annotations

import torch

from plasticlm.config import Field, configclass
from plasticlm.fednl.methods.base import FedMethod, keep_local, previous_local
from plasticlm.fednl.objective import LocalObjective
from plasticlm.fednl.registries import FEDERATED_METHODS


@configclass
class FedSSIConfig:
    """FedSSI's knobs (``method.fedssi.*``)."""

    c: float = Field(0.1, ge=0, description="penalty strength")
    xi: float = Field(1e-3, gt=0, description="synaptic-intelligence damping")
    mix: float = Field(0.5, ge=0, le=1, description="anchor = mix * local + (1 - mix) * global")


class SynapticIntelligence(LocalObjective):
    """c * sum Omega (w - w_anchor)^2, the anchor a mix of the previous local and the global
    theta; Omega accumulates -g * dtheta along the local trajectory."""

    def __init__(self, params, global_theta: dict, state: dict, cfg: FedSSIConfig):
        local_prev = previous_local(state)
        self.c, self.xi = cfg.c, cfg.xi
        self.anchor = {n: cfg.mix * local_prev[n] + (1 - cfg.mix) * global_theta[n]
                       if n in local_prev else global_theta[n] for n in global_theta}
        self.importance = {n: state.get(f"si.{n}", torch.zeros_like(global_theta[n]))
                           for n in params}
        self.omega = {n: torch.zeros_like(global_theta[n]) for n in params}
        self.before: dict = {}
        self.grads: dict = {}

    def penalty(self, params):
        if not any(v.any() for v in self.importance.values()):
            return None
        return self.c * sum((self.importance[n] * (p.float() - self.anchor[n]) ** 2).sum()
                            for n, p in params.items())

    def before_step(self, params):
        self.before = {n: p.detach().float().clone() for n, p in params.items()}
        self.grads = {n: p.grad.detach().float().clone() for n, p in params.items()
                      if p.grad is not None}

    def after_step(self, params):
        for n, p in params.items():
            if n in self.grads:
                self.omega[n] -= self.grads[n] * (p.detach().float() - self.before[n])

    def finish(self, theta, start, state):
        for n in self.importance:
            delta = theta[n] - start[n]
            state[f"si.{n}"] = self.importance[n] + self.omega[n].clamp(min=0) / (delta**2 + self.xi)


@FEDERATED_METHODS.register("fedssi")
class FedSSI(FedMethod):
    """FedAvg with a synaptic-intelligence penalty towards a surrogate anchor."""

    def objective(self, params, global_theta, state, cfg):
        return SynapticIntelligence(params, global_theta, state, cfg.fedssi)

    def keep(self, theta, state):
        keep_local(theta, state)
