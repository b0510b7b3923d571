"""FedNL's own methods: theta is the memory's meta-parameters (the rules that write the
memory), and ``fednl-personal`` keeps each client's gate at home (the paper's nested split)."""

from __future__ import annotations

from plasticlm.errors import PlasticError
from plasticlm.fednl.methods.base import FedMethod
from plasticlm.fednl.registries import FEDERATED_METHODS
from plasticlm.memory import attach_memory, save_pretrained


@FEDERATED_METHODS.register("fednl")
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
                             lora_alpha=cfg.lora_alpha, conv_size=memory.conv_size,
                             gate_init=memory.gate_init, mix=memory.mix,
                             memory_norm=memory.memory_norm, recurrent=memory.recurrent,
                             gate=memory.gate, decay=memory.decay, lora_scope=memory.lora_scope)

    def save(self, model, tokenizer, folder):
        save_pretrained(model, folder)     # the memory adapter (safetensors + config)


def is_personal(name: str) -> bool:
    """Whether a FedNL theta entry is the client's own under the nested split: the gate
    (logit and input projection) and the memory's norm, which decide how much of the memory
    this client's task reads, not how the memory is written."""
    return name.endswith("gate_logit") or ".gate_proj." in name or ".memory_norm." in name


@FEDERATED_METHODS.register("fednl-personal")
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
