"""FedAvg over a static LoRA, the base every federated method refines (:class:`FedMethod`),
and :func:`prepare_model`, which makes exactly a method's theta trainable."""

from __future__ import annotations

from peft import LoraConfig, get_peft_model
from torch import nn

from plasticlm.fednl.objective import LocalObjective
from plasticlm.fednl.registries import FEDERATED_METHODS
from plasticlm.memory import attach_memory, memory_config, portable_peft_adapter

# The config types (MethodConfig, MemoryOptions, TrainConfig of fednl.config_sections) are not
# imported here: MethodConfig embeds each method's own config class, defined beside the method.

LORA_TARGETS = ("q_proj", "k_proj", "v_proj")


def prepare_model(model: nn.Module, method, memory) -> nn.Module:
    """Make exactly theta trainable on ``model`` for ``method.name`` (memory or LoRA
    attached in place or wrapped); returns the model to train."""
    return FEDERATED_METHODS[method.name]().prepare(model, method, memory)


@FEDERATED_METHODS.register("fedavg")
class FedMethod:
    """A federated method: which parameters form theta, how a round starts, what it adds to
    the local objective, which personal state it keeps. The base is FedAvg over a static
    LoRA on the frozen base's q/k/v, with the same windowed attention as FedNL.

    A new method is one subclass in its own file, decorated ``@FEDERATED_METHODS.register("name")``."""

    memory = False   # whether theta is FedNL's memory (which needs an attention window)

    def prepare(self, model: nn.Module, cfg, memory) -> nn.Module:
        model = windowed(model, cfg)
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=list(LORA_TARGETS), bias="none")
        return get_peft_model(model, lora)

    def extra_batches(self, cfg) -> int:
        """Batches the round draws before training (FedALA learns its weights on them)."""
        return 0

    def initial(self, model, global_theta: dict, state: dict, batches, cfg
                ) -> dict:
        """The round's starting theta (``batches`` may be drawn from before training)."""
        return global_theta

    def learning_rate(self, train) -> float:
        return train.lr

    def objective(self, params, global_theta: dict, state: dict, cfg
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


def windowed(model: nn.Module, cfg) -> nn.Module:
    """``model`` with ``cfg.window``-token attention and no memory (0: unchanged)."""
    if cfg.window > 0:  # the same windowed attention as fednl, without a memory
        model = attach_memory(model, layers=[], window=cfg.window)
    return model


def previous_local(state: dict) -> dict:
    """The client's theta at the end of its previous round, from its personal state."""
    return {k[len("local."):]: v for k, v in state.items() if k.startswith("local.")}


def keep_local(theta: dict, state: dict) -> None:
    """Keep this round's local theta in the client's personal state."""
    for n, v in theta.items():
        state[f"local.{n}"] = v
