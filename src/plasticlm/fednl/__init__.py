"""FedNL, federated nested learning: a frozen base LLM gains a delta-rule memory
(:mod:`plasticlm.memory`); clients learn the rules that write it (theta: LoRA on the memory's
q/k/v, its write strength and the gate), a Flower server aggregates only theta, and the memory
state adapts at inference without leaving the device.

The mechanism, one import away (loaded on first use, so that ``import plasticlm.fednl`` stays
light)::

    from plasticlm.fednl import MethodConfig, TrainConfig, MemoryOptions, prepare_model
    from plasticlm.fednl import AggregationConfig, client_update, get_theta, robust_aggregate

    method = MethodConfig(name="fednl", window=64)
    model = prepare_model(base_model, method, MemoryOptions())
    start = get_theta(model)                      # the global theta a client receives
    theta, metrics = client_update(model, batches, start, {}, method, TrainConfig())
    new_global, info = robust_aggregate([theta, other_theta], [n_mine, n_other], start,
                                        AggregationConfig(), max_examples=10_000)

The Flower apps to embed are ``client_app`` and ``server_app``; a whole run on Flower's
simulation runtime is :func:`run_federated` (``plasticlm fednl run`` on the command line).
"""

from __future__ import annotations

import importlib

# name -> the module that defines it: imported when the name is first asked for (PEP 562)
_EXPORTS = {
    "FedNLConfig": "plasticlm.fednl.config",
    "MethodConfig": "plasticlm.fednl.config_sections",
    "MemoryOptions": "plasticlm.fednl.config_sections",
    "TrainConfig": "plasticlm.fednl.config_sections",
    "AggregationConfig": "plasticlm.fednl.config_sections",
    "FEDERATED_METHODS": "plasticlm.fednl.registries",
    "FedProxConfig": "plasticlm.fednl.methods.fedprox",
    "FedALAConfig": "plasticlm.fednl.methods.fedala",
    "FedSSIConfig": "plasticlm.fednl.methods.fedssi",
    "prepare_model": "plasticlm.fednl.methods",
    "client_update": "plasticlm.fednl.local_round",
    "local_update": "plasticlm.fednl.local_round",
    "get_theta": "plasticlm.fednl.theta",
    "set_theta": "plasticlm.fednl.theta",
    "trainable": "plasticlm.fednl.theta",
    "weighted_mean": "plasticlm.fednl.replies",
    "reply_problem": "plasticlm.fednl.replies",
    "robust_aggregate": "plasticlm.fednl.aggregators",
    "client_app": "plasticlm.fednl.flower.client_app",
    "server_app": "plasticlm.fednl.flower.server_app",
    "run_federated": "plasticlm.fednl.run",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'plasticlm.fednl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
