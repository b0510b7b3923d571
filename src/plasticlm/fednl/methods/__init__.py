"""The federated methods: what each trains, sends, and adds to the local objective.

All methods share one client update (:func:`plasticlm.fednl.local_round.client_update`) and one
aggregation (:mod:`plasticlm.fednl.aggregators`); they differ only in

- which parameters form theta (what trains and what travels): ``fednl`` the memory's
  meta-parameters (LoRA for memory q/k/v, beta projection, gate; :mod:`.nested`);
  ``fedavg`` (:mod:`.base`), ``fedprox``, ``fedala``, ``fedssi`` a static LoRA on the frozen
  base's q/k/v; ``fedavg-full`` every weight of the model (:mod:`.full`);
- the extra local term: FedProx's (mu/2)||w - w_global||^2 (:mod:`.fedprox`), FedSSI's
  synaptic-intelligence penalty c * sum Omega (w - w_anchor)^2 (:mod:`.fedssi`);
- the initialisation: FedALA mixes the global theta into the client's previous local theta
  with learned element-wise weights on the top layers (:mod:`.fedala`);
- what stays on the client: ``fednl-personal`` (the paper's nested split) keeps each
  client's gate (and memory norm) local and shares only the rules that write the memory.

A method with knobs of its own defines its config class beside it (``FedProxConfig``, like
PEFT's ``LoraConfig``), and the run config holds it under the method's name
(``method.fedprox.mu``). A new method is one file here: a :class:`FedMethod` subclass
decorated ``@FEDERATED_METHODS.register("name")``, imported below.

Personalised state (ALA weights, SI importances, previous local theta, fednl-personal's
gate) is a flat ``dict[str, Tensor]`` that the client keeps; it never travels.
"""

from plasticlm.fednl.methods.base import LORA_TARGETS, FedMethod, prepare_model
from plasticlm.fednl.methods.fedala import FedALA, FedALAConfig, ala_initialise
from plasticlm.fednl.methods.fedprox import FedProx, FedProxConfig
from plasticlm.fednl.methods.fedssi import FedSSI, FedSSIConfig
from plasticlm.fednl.methods.full import FedAvgFull
from plasticlm.fednl.methods.nested import FedNL, FedNLPersonal, is_personal
from plasticlm.fednl.registries import FEDERATED_METHODS

__all__ = ["FEDERATED_METHODS", "LORA_TARGETS", "FedMethod", "prepare_model", "FedNL", "FedNLPersonal",
           "is_personal", "FedAvgFull", "FedProx", "FedProxConfig", "FedALA", "FedALAConfig",
           "ala_initialise", "FedSSI", "FedSSIConfig"]
