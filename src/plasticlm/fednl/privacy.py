"""The ``privacy`` section of FedNL's run config: Flower's own differential-privacy wrappers
and secure aggregation (SecAgg+), as settings of a run, checked against the aggregation
settings when the config is loaded.

- ``mode``: ``none``; ``central-fixed`` / ``central-adaptive`` (the server clips each update
  and adds Gaussian noise to the aggregate: Flower's
  ``DifferentialPrivacyServerSide{Fixed,Adaptive}Clipping``); ``client-fixed`` /
  ``client-adaptive`` (each client clips its own update with Flower's
  ``fixedclipping_mod`` / ``adaptiveclipping_mod``, the server adds the noise:
  ``DifferentialPrivacyClientSide{Fixed,Adaptive}Clipping``). McMahan et al. 2017,
  arXiv:1710.06963; Andrew et al. 2019, arXiv:1905.03871 (adaptive clipping).
- ``secagg``: the clients' theta reach the server only as their weighted sum (Flower's
  ``SecAggPlusWorkflow`` and ``secaggplus_mod``; Bell et al. 2020, eprint 2020/704).

Wired in :mod:`plasticlm.fednl.flower.privacy_server` and :mod:`plasticlm.fednl.flower.privacy_client`.
"""

from __future__ import annotations

from typing import Literal

from plasticlm.config import Field, configclass
from plasticlm.errors import PlasticError

# the fit config key naming theta's tensors under SecAgg+: legacy Parameters carry no names
NAMES_KEY = "theta-names"


@configclass
class PrivacyConfig:
    """Differential privacy and secure aggregation, both Flower's own."""

    mode: Literal["none", "central-fixed", "central-adaptive", "client-fixed",
                  "client-adaptive"] = Field(
        "none", description="differential privacy: none; central-*: the server clips each "
        "update; client-*: each client clips its own; the server adds Gaussian noise to the "
        "aggregate in every DP mode (fixed or adaptive clipping norm)")
    noise_multiplier: float = Field(1.0, gt=0, description="DP: noise std = noise_multiplier "
                                    "x clipping_norm / clients")
    clipping_norm: float = Field(1.0, gt=0, description="DP fixed: L2 bound of each client's "
                                 "update; adaptive: the initial bound")
    target_quantile: float = Field(0.5, gt=0, lt=1, description="DP adaptive: share of "
                                   "updates the bound should leave unclipped")
    clip_lr: float = Field(0.2, gt=0, description="DP adaptive: learning rate of the bound")
    secagg: bool = Field(False, description="secure aggregation (SecAgg+): the server sees "
                         "only the clients' weighted sum of theta")
    num_shares: int = Field(0, ge=0, description="SecAgg+: shares of each client's keys "
                            "(its neighbours in the protocol, itself included; at most the "
                            "clients); 0: every client")
    reconstruction_threshold: int = Field(2, ge=2, description="SecAgg+: shares needed to "
                                          "recover a dropped client's mask")
    clipping_range: float = Field(8.0, gt=0, description="SecAgg+: each value of theta is "
                                  "clipped to [-range, range] before quantisation")
    quantization_range: int = Field(4194304, ge=2, le=2**31, description="SecAgg+: levels "
                                    "of the quantisation (error ~ 2 range / levels)")

    def __post_init__(self):
        if 0 < self.num_shares < self.reconstruction_threshold:
            raise PlasticError(f"config privacy.num_shares={self.num_shares} must be 0 (every "
                               "client) or at least privacy.reconstruction_threshold="
                               f"{self.reconstruction_threshold}")
        if self.secagg and self.mode.startswith("central"):
            raise PlasticError(f"privacy.mode={self.mode} clips each update on the server, "
                               "which privacy.secagg hides from it: use a client-* mode")
        if self.secagg and self.mode == "client-adaptive":
            raise PlasticError("privacy.mode=client-adaptive sends each client's clipping "
                               "bit beside its update, which privacy.secagg does not carry: "
                               "use client-fixed")

    @property
    def dp(self) -> bool:
        return self.mode != "none"


def privacy_problem(privacy: PrivacyConfig, rule: str, clip: float,
                    clients: int | None = None, server_opt: str = "none") -> str | None:
    """Why ``privacy`` cannot run with the aggregation ``rule``, relative ``clip`` and
    ``server_opt`` (and, when known, over ``clients`` clients), or None."""
    if privacy.secagg:
        if rule != "mean":
            return (f"aggregation.rule={rule} needs each client's update, which "
                    "privacy.secagg hides from the server: use aggregation.rule=mean")
        if clip > 0:
            return ("aggregation.clip clips each update on the server, which privacy.secagg "
                    "hides from it: set aggregation.clip=0 (privacy.clipping_range bounds "
                    "each value instead)")
        if clients is not None and clients < max(2, privacy.num_shares,
                                                 privacy.reconstruction_threshold):
            return (f"privacy.secagg over {clients} clients: needs at least 2, and no fewer "
                    f"than privacy.num_shares={privacy.num_shares} and "
                    f"reconstruction_threshold={privacy.reconstruction_threshold}")
    if privacy.dp:
        if rule != "mean":
            # the noise is calibrated to the mean's sensitivity (clipping_norm / clients);
            # one client moves a median or Krum's choice by up to the whole bound
            return (f"privacy.mode={privacy.mode} calibrates its noise to the mean of the "
                    f"clipped updates; aggregation.rule={rule} is not a mean: use "
                    "aggregation.rule=mean")
        if server_opt != "none":
            # Flower's DP wrapper adds the noise after the inner strategy's step, so the
            # optimiser's moments would carry earlier rounds' updates without their noise
            return (f"privacy.mode={privacy.mode} adds its noise after the server's step: "
                    f"aggregation.server_opt={server_opt} would keep earlier rounds' updates "
                    "un-noised in its moments; use aggregation.server_opt=none")
    return None
