"""What a memory is (:class:`MemoryConfig`): the layers it joins, its window, LoRA rank,
gate, mix and decay; saved beside theta as JSON."""

from __future__ import annotations

from typing import Literal

from plasticlm.config import Field, configclass

Mix = Literal["convex", "additive"]
Gate = Literal["head", "input"]
LoraScope = Literal["memory", "shared"]


@configclass
class MemoryConfig:
    """What :func:`plasticlm.memory.attach_memory` builds; saved next to theta as JSON."""

    layers: tuple[int, ...] = Field((), description="layers that get a memory branch")
    window: int = Field(256, gt=0, description="softmax attention window (tokens, including "
                        "the query)")
    rank: int = Field(8, gt=0, description="LoRA rank of the memory's q/k/v")
    lora_alpha: float = Field(16.0, description="LoRA scale = lora_alpha / rank")
    conv_size: int = Field(0, ge=0, description="short causal depthwise convolution on q/k/v; "
                           "0 = none")
    # -16 here, 0 in FedNL's runs and experiments (fednl memory.gate_init, MQAR): attached with
    # the default, a memory leaves the model's outputs as they were (alpha ~ 1e-7) until
    # training opens the gate; FedNL starts half open because a gate at -16 barely moves in a
    # few local steps (docs/fednl.md, "Memory-augmented attention")
    gate_init: float = Field(-16.0, description="initial gate logit; alpha = sigmoid(gate_init); "
                             "-16 leaves the model unchanged at attach time, FedNL uses 0")
    chunk_size: int = Field(64, gt=0, description="delta-rule chunk for sequences longer than it")
    # False: each token writes into an empty state and reads it back, o_t = beta_t (k_t . q_t)
    # v_t, so nothing is remembered across tokens.
    recurrent: bool = Field(True, description="false removes the recurrence (a control)")
    mix: Mix = Field("convex", description="per head: convex attn + alpha (mem - attn), or "
                     "additive attn + alpha * mem (the attention never scaled down)")
    memory_norm: bool = Field(False, description="RMS-normalise each head's memory read "
                              "(learned per-channel scale, part of theta)")
    gate: Gate = Field("head", description="head: one gate logit per head; input: "
                       "alpha_t,h = sigmoid(w_h . x_t + gate_logit_h)")
    decay: bool = Field(False, description="gated delta rule: the state decays by exp(g_t) "
                        "before each write (Gated DeltaNet)")
    decay_init: float = Field(4.6, description="decay bias: exp(g) = sigmoid(4.6) = 0.99 at "
                              "attach time")
    lora_scope: LoraScope = Field("memory", description="memory: LoRA on the memory's q/k/v "
                                  "only; shared: on the q/k/v both branches read")
    model_type: str = Field("", description="architecture it was attached to (checked on load)")
