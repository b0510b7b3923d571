"""The federated methods: what each trains, sends, and adds to the local objective.

All methods share one client update (:func:`plasticlm.fednl.local.local_update`) and one aggregation (weighted
mean, :mod:`plasticlm.fednl.replies`); they differ only in

- which parameters form theta (what trains and what travels):
  ``fednl`` the memory's meta-parameters (LoRA for memory q/k/v, beta projection, gate);
  ``fedavg``/``fedprox``/``fedala``/``fedssi`` a static LoRA on the frozen base's q/k/v;
  ``fedavg-full`` every weight of the model;
- the extra local term: FedProx's (mu/2)||w - w_global||^2, FedSSI's synaptic-intelligence
  penalty c * sum Omega (w - w_anchor)^2;
- the initialisation: FedALA mixes the global theta into the client's previous local theta
  with learned element-wise weights on the top layers;
- what stays on the client: ``fednl-personal`` (the paper's nested split) keeps each
  client's gate (and memory norm) local and shares only the rules that write the memory.

Personalised state (ALA weights, SI importances, previous local theta, fednl-personal's
gate) is a flat ``dict[str, Tensor]`` that the client keeps; it never travels.
"""


from __future__ import annotations

import logging

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from plasticlm.errors import PlasticError
from plasticlm.fednl.objective import LocalObjective, answer_loss
from plasticlm.fednl.sections import METHODS, MemoryOptions, MethodConfig, TrainConfig
from plasticlm.fednl.theta import layer_of, set_theta, trainable
from plasticlm.memory import (
    attach_memory,
    memory_config,
    portable_peft_adapter,
    save_base_model,
    save_pretrained,
)

log = logging.getLogger("plasticlm.fednl")

LORA_TARGETS = ("q_proj", "k_proj", "v_proj")


def prepare_model(model: nn.Module, method: MethodConfig, memory: MemoryOptions) -> nn.Module:
    """Make exactly theta trainable on ``model`` for ``method.name`` (memory or LoRA
    attached in place or wrapped); returns the model to train."""
    return METHODS[method.name]().prepare(model, method, memory)


def ala_initialise(model, global_theta: dict, state: dict, batches, cfg: MethodConfig) -> dict:
    """FedALA's adaptive local aggregation; returns the personalised initial theta.

    theta_hat = theta_local + (theta_global - theta_local) * W on the top ``ala_layers``
    layers (W in [0,1], learned on a few local batches), plain theta_global below them.
    """
    local = _previous_local(state)
    if not local:
        return dict(global_theta)  # first round: nothing personal yet
    layers = [x for x in (layer_of(n) for n in global_theta) if x is not None]
    top = set(range(max(layers) - cfg.ala_layers + 1, max(layers) + 1)) if layers else set()
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
                    w.sub_(cfg.ala_lr * g.float() * (global_theta[n] - local[n])).clamp_(0, 1)
    for n, w in weights.items():
        state[f"ala.{n}"] = w
    model.zero_grad(set_to_none=True)
    return {n: (local[n] + (global_theta[n] - local[n]) * weights[n]) if n in weights
            else global_theta[n] for n in global_theta}


@METHODS.register("fedavg")
class FedMethod:
    """A federated method: which parameters form theta, how a round starts, what it adds to
    the local objective, which personal state it keeps. The base is FedAvg over a static
    LoRA on the frozen base's q/k/v, with the same windowed attention as FedNL.

    A new method is one subclass here, decorated ``@METHODS.register("name")``."""

    memory = False   # whether theta is FedNL's memory (which needs an attention window)

    def prepare(self, model: nn.Module, cfg: MethodConfig, memory: MemoryOptions) -> nn.Module:
        model = _windowed(model, cfg)
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=list(LORA_TARGETS), bias="none")
        return get_peft_model(model, lora)

    def initial(self, model, global_theta: dict, state: dict, batches, cfg: MethodConfig
                ) -> dict:
        """The round's starting theta (``batches`` may be drawn from before training)."""
        return global_theta

    def learning_rate(self, train: TrainConfig) -> float:
        return train.lr

    def objective(self, params, global_theta: dict, state: dict, cfg: MethodConfig
                  ) -> LocalObjective:
        return LocalObjective()

    def keep(self, theta: dict, state: dict) -> None:
        """Update the client's personal state after the round (nothing by default)."""

    def shared(self, theta: dict, global_theta: dict) -> dict:
        """What the client sends after its round: its local theta (all of it by default)."""
        return theta

    def personalise(self, global_theta: dict, state: dict) -> dict:
        """The theta this client answers with: the global theta (by default), or the global
        theta with the client's own share of it from ``state``."""
        return global_theta

    def save(self, model: nn.Module, tokenizer, folder) -> None:
        """The trained model in the ecosystem's format: here a PEFT LoRA adapter folder whose
        keys are the plain base model's (``PeftModel.from_pretrained(base, folder)`` loads
        every LoRA weight), with a model card saying so."""
        model.save_pretrained(folder)
        config = memory_config(model.get_base_model())
        portable_peft_adapter(folder, config.window if config else None, "plasticlm fednl run")


def _windowed(model: nn.Module, cfg: MethodConfig) -> nn.Module:
    if cfg.window > 0:  # the same windowed attention as fednl, without a memory
        model = attach_memory(model, layers=[], window=cfg.window)
    return model


@METHODS.register("fednl")
class FedNL(FedMethod):
    """theta = the memory's meta-parameters (LoRA for the memory's q/k/v, beta, gate)."""

    memory = True

    def prepare(self, model, cfg, memory):
        layers = memory.layers
        if layers != "all":
            layers = [int(x) for x in layers.split(",") if x.strip()]
        if cfg.window <= 0:
            raise PlasticError("fednl needs an attention window (method.window > 0): the "
                               "memory holds what falls out of it")
        return attach_memory(model, layers=layers, window=cfg.window, rank=cfg.lora_rank,
                             lora_alpha=cfg.lora_alpha, conv_size=memory.conv,
                             gate_init=memory.gate_init, mix=memory.mix,
                             memory_norm=memory.norm, recurrent=memory.recurrent,
                             gate=memory.gate, decay=memory.decay, lora_scope=memory.lora)

    def save(self, model, tokenizer, folder):
        save_pretrained(model, folder)     # the memory adapter (safetensors + config)


def is_personal(name: str) -> bool:
    """Whether a FedNL theta entry is the client's own under the nested split: the gate
    (logit and input projection) and the memory's norm, which decide how much of the memory
    this client's task reads, not how the memory is written."""
    return name.endswith("gate_logit") or ".gate_proj." in name or ".memory_norm." in name


@METHODS.register("fednl-personal")
class FedNLPersonal(FedNL):
    """FedNL's nested split: the rules that write the memory (LoRA, beta, conv) are shared;
    each client's gate and memory norm stay on the client (:func:`is_personal`)."""

    def initial(self, model, global_theta, state, batches, cfg):
        return self.personalise(global_theta, state)

    def personalise(self, global_theta, state):
        return {n: state.get(f"personal.{n}", v) if is_personal(n) else v
                for n, v in global_theta.items()}

    def shared(self, theta, global_theta):
        # the reply keeps theta's layout (the server validates it) but its personal entries
        # are the ones received: their mean stays the initial gate and carries nothing local
        return {n: global_theta[n] if is_personal(n) else v for n, v in theta.items()}

    def keep(self, theta, state):
        state.update({f"personal.{n}": v for n, v in theta.items() if is_personal(n)})


@METHODS.register("fedavg-full")
class FedAvgFull(FedMethod):
    """theta = every weight of the model."""

    def prepare(self, model, cfg, memory):
        if next(model.parameters()).dtype != torch.float32:
            # Adam's steps of ~1e-4 relative vanish in bfloat16 weights: theta is float32
            log.info("fedavg-full trains every weight: the model is kept in float32")
            model = model.float()
        model = _windowed(model, cfg)
        for p in model.parameters():
            p.requires_grad_(True)
        return model

    def learning_rate(self, train):
        return train.full_lr

    def save(self, model, tokenizer, folder):
        # an HF folder under the plain model's names (the window wrapper's are not)
        save_base_model(model, folder)
        tokenizer.save_pretrained(folder)


class _Proximal(LocalObjective):
    def __init__(self, global_theta: dict, mu: float):
        self.global_theta, self.mu = global_theta, mu

    def penalty(self, params):
        return self.mu / 2 * sum(((p.float() - self.global_theta[n]) ** 2).sum()
                                 for n, p in params.items())


@METHODS.register("fedprox")
class FedProx(FedMethod):
    """FedAvg plus (mu/2)||w - w_global||^2 in the local objective."""

    def objective(self, params, global_theta, state, cfg):
        return _Proximal(global_theta, cfg.prox_mu)


def _previous_local(state: dict) -> dict:
    return {k[len("local."):]: v for k, v in state.items() if k.startswith("local.")}


def _keep_local(theta: dict, state: dict) -> None:
    for n, v in theta.items():
        state[f"local.{n}"] = v


@METHODS.register("fedala")
class FedALA(FedMethod):
    """FedAvg whose round starts from the global theta mixed into the client's previous
    local theta with learned element-wise weights (:func:`ala_initialise`)."""

    def initial(self, model, global_theta, state, batches, cfg):
        return ala_initialise(model, global_theta, state,
                              [next(batches) for _ in range(cfg.ala_steps)], cfg)

    def keep(self, theta, state):
        _keep_local(theta, state)


class _SynapticIntelligence(LocalObjective):
    """FedSSI: c * sum Omega (w - w_anchor)^2, the anchor a mix of the previous local and the
    global theta; Omega accumulates -g * dtheta along the local trajectory."""

    def __init__(self, params, global_theta: dict, state: dict, cfg: MethodConfig):
        local_prev = _previous_local(state)
        self.c, self.xi = cfg.si_c, cfg.si_xi
        self.anchor = {n: cfg.si_mix * local_prev[n] + (1 - cfg.si_mix) * global_theta[n]
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


@METHODS.register("fedssi")
class FedSSI(FedMethod):
    """FedAvg with a synaptic-intelligence penalty towards a surrogate anchor."""

    def objective(self, params, global_theta, state, cfg):
        return _SynapticIntelligence(params, global_theta, state, cfg)

    def keep(self, theta, state):
        _keep_local(theta, state)

