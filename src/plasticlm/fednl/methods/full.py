"""``fedavg-full``: FedAvg of every weight of the model (the costly upper baseline)."""

from __future__ import annotations

import logging

import torch

from plasticlm.fednl.methods.base import FedMethod, windowed
from plasticlm.fednl.registries import FEDERATED_METHODS
from plasticlm.memory import save_base_model

log = logging.getLogger("plasticlm.fednl")


@FEDERATED_METHODS.register("fedavg-full")
class FedAvgFull(FedMethod):
    """theta = every weight of the model."""

    def prepare(self, model, cfg, memory):
        if next(model.parameters()).dtype != torch.float32:
            # Adam's steps of ~1e-4 relative vanish in bfloat16 weights: theta is float32
            log.info("fedavg-full trains every weight: the model is kept in float32")
            model = model.float()
        model = windowed(model, cfg)
        for p in model.parameters():
            p.requires_grad_(True)
        return model

    def learning_rate(self, train):
        return train.full_lr

    def save(self, model, tokenizer, folder):
        # an HF folder under the plain model's names (the window wrapper's are not)
        save_base_model(model, folder)
        tokenizer.save_pretrained(folder)
