"""The server side of FedNL's ``privacy`` settings, built from Flower's own parts.

Differential privacy wraps :class:`ThetaAverage` in Flower's Message-API DP strategy of the
mode (``flwr.serverapp.strategy.DifferentialPrivacy*``): clipping (server-side modes) and the
Gaussian noise are Flower's. Secure aggregation runs each round's training through Flower's
``SecAggPlusWorkflow``, which in Flower 1.42 exists only for the legacy workflow API (a
``LegacyContext`` and a legacy strategy's ``configure_fit`` / ``aggregate_fit``): a small
bridge gives it :class:`ThetaAverage`'s messages as ``FitIns`` and takes back the unmasked
weighted mean; evaluation stays on the Message API. With ``client-fixed`` the bridge is
wrapped in Flower's legacy ``DifferentialPrivacyClientSideFixedClipping`` (the noise on the
unmasked sum). In every mode the theta committed is the one released: noise included.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import FitIns, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat
from flwr.server import LegacyContext, ServerConfig
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping as LegacyClientDP
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
)

from plasticlm.errors import PlasticError
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.flower.messages import arrays_problem, pack_theta, unpack_theta
from plasticlm.fednl.flower.strategy import RoundFailed, ThetaAverage
from plasticlm.fednl.privacy import NAMES_KEY, privacy_problem

log = logging.getLogger("plasticlm.fednl")


def _released(wrapper: type) -> type:
    """``wrapper`` (a Flower DP strategy) that refuses a round unless every client's reply
    is well formed and used (the noise is calibrated to all of them), and has
    :class:`ThetaAverage` commit the aggregate Flower released, noise included."""

    class Released(wrapper):
        def aggregate_train(self, server_round, replies):
            replies, inner = list(replies), self.strategy
            # Flower's server-side clipping reads each reply before ThetaAverage validates it
            problems = [m.error.reason[:200] if m.has_error() else
                        "no arrays record" if "arrays" not in m.content.array_records else
                        arrays_problem(m.content["arrays"], inner.reference) for m in replies]
            problems = [p for p in problems if p]
            if problems or len(replies) < self.num_sampled_clients:
                raise RoundFailed(f"round {inner.record['round']}: differential privacy needs "
                                  f"all {self.num_sampled_clients} clients' updates, got "
                                  f"{len(replies) - len(problems)} usable ({problems[:3]}); "
                                  "the last checkpoint is intact, rerun with --resume")
            # Flower clips by position: each reply's tensors in the order of the sent theta
            order = list(getattr(self, "current_arrays", None) or inner.reference)
            for m in replies:
                got = m.content["arrays"]
                m.content["arrays"] = ArrayRecord({k: got[k] for k in order})
            arrays, metrics = super().aggregate_train(server_round, replies)
            if arrays is None or len(inner.record.get("clients", {})) < len(replies):
                raise RoundFailed(f"round {inner.record['round']}: differential privacy "
                                  f"released no aggregate of all {len(replies)} clients "
                                  f"(rejected: {inner.record.get('rejected', [])[:3]})")
            inner.aggregate = unpack_theta(arrays)
            return arrays, metrics

    Released.__name__ = Released.__qualname__ = f"Committed{wrapper.__name__}"
    return Released


WRAPPERS = {"central-fixed": _released(DifferentialPrivacyServerSideFixedClipping),
            "central-adaptive": _released(DifferentialPrivacyServerSideAdaptiveClipping),
            "client-fixed": _released(DifferentialPrivacyClientSideFixedClipping),
            "client-adaptive": _released(DifferentialPrivacyClientSideAdaptiveClipping)}


def with_privacy(strategy: ThetaAverage, cfg: FedNLConfig, num_nodes: int):
    """``strategy`` in Flower's DP wrapper of ``cfg.privacy.mode`` (itself for none)."""
    p = cfg.privacy
    if p.mode in ("central-fixed", "client-fixed"):
        return WRAPPERS[p.mode](strategy, p.noise_multiplier, p.clipping_norm, num_nodes)
    if p.dp:
        return WRAPPERS[p.mode](strategy, p.noise_multiplier, num_nodes,
                                initial_clipping_norm=p.clipping_norm,
                                target_clipped_quantile=p.target_quantile,
                                clip_norm_lr=p.clip_lr)
    return strategy


class SecAggBridge:
    """The two calls ``SecAggPlusWorkflow`` makes of a legacy strategy, answered by
    :class:`ThetaAverage`: its training messages as ``FitIns``; the unmasked mean back as
    the round's aggregate, with the clients' metrics (which travel unmasked)."""

    def __init__(self, strategy: ThetaAverage, names: list[str], grid):
        self.strategy, self.names, self.grid = strategy, names, grid
        self.aggregated: int | None = None   # the last round aggregate_fit was called for

    def configure_fit(self, server_round, parameters, client_manager):
        arrays = self.arrays(parameters)
        msgs = self.strategy.configure_train(server_round, arrays, ConfigRecord(), self.grid)
        run_id = self.grid.run.run_id
        return [(GridClientProxy(m.metadata.dst_node_id, self.grid, run_id),
                 FitIns(compat.arrayrecord_to_parameters(m.content["arrays"], True),
                        {**dict(m.content["config"]), NAMES_KEY: self.names}))
                for m in msgs]

    def arrays(self, parameters) -> ArrayRecord:
        """Legacy ``Parameters`` (theta's tensors in ``names`` order) as theta's record."""
        values = parameters_to_ndarrays(parameters)
        return pack_theta({n: torch.from_numpy(np.asarray(v, dtype=np.float32))
                           for n, v in zip(self.names, values, strict=True)}, "float32")

    def aggregate_fit(self, server_round, results, failures):
        rec = self.strategy.record
        if failures or not results:
            log.warning("round %s: secure aggregation failed: %d failure(s)", rec["round"],
                        len(failures))
            return None, {}
        self.aggregated = server_round
        rec["aggregation"] = {"rule": "secagg+ mean",
                              "weights": [float(r.num_examples) for _, r in results]}
        rec["clients"] = {str(r.metrics["name"]): {
            "domain": str(r.metrics["domain"]), "train_loss": float(r.metrics["train_loss"]),
            **({"local_acc": float(r.metrics["local-acc"])} if "local-acc" in r.metrics else {}),
            **({"runtime": str(r.metrics["runtime"])[:40]} if "runtime" in r.metrics else {}),
        } for _, r in results}
        return results[0][1].parameters, {}


def secagg_rounds(grid, strategy: ThetaAverage, theta: dict[str, torch.Tensor],
                  num_rounds: int, cfg: FedNLConfig, num_nodes: int) -> None:
    """Run ``num_rounds`` rounds whose training is aggregated by SecAgg+ (and noised by
    client-side DP if asked); each round evaluated and committed by ``strategy``."""
    p = cfg.privacy
    names = list(theta)
    bridge = SecAggBridge(strategy, names, grid)
    legacy = LegacyClientDP(bridge, p.noise_multiplier, p.clipping_norm, num_nodes) \
        if p.mode == "client-fixed" else bridge
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                    run_config={}),
                            config=ServerConfig(num_rounds=num_rounds), strategy=legacy)
    workflow = SecAggPlusWorkflow(
        num_shares=p.num_shares or 1.0,   # a float: that share of the round's clients
        reconstruction_threshold=p.reconstruction_threshold,
        max_weight=float(cfg.data.max_train), clipping_range=p.clipping_range,
        quantization_range=p.quantization_range, timeout=cfg.federation.round_timeout)
    arrays = pack_theta(theta, "float32")
    for rnd in range(1, num_rounds + 1):
        context.state.array_records[MAIN_PARAMS_RECORD] = arrays
        context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
            {Key.CURRENT_ROUND: rnd, Key.START_TIME: time.time()})
        workflow(grid, context)
        if bridge.aggregated != rnd or context.state.array_records[MAIN_PARAMS_RECORD] is arrays:
            raise RoundFailed(f"round {strategy.record['round']}: secure aggregation did not "
                              "finish (a client failed or dropped below privacy."
                              "reconstruction_threshold); the last checkpoint is intact, "
                              "rerun with --resume")
        arrays = bridge.arrays(compat.arrayrecord_to_parameters(
            context.state.array_records[MAIN_PARAMS_RECORD], True))
        strategy.aggregate = unpack_theta(arrays)
        replies = grid.send_and_receive(
            list(strategy.configure_evaluate(rnd, arrays, ConfigRecord(), grid)),
            timeout=cfg.federation.round_timeout)
        strategy.aggregate_evaluate(rnd, replies)


def run_rounds(grid, strategy: ThetaAverage, theta: dict[str, torch.Tensor], num_rounds: int,
               cfg: FedNLConfig, num_nodes: int) -> None:
    """The run's remaining rounds under its privacy settings (plain FedNL for none)."""
    problem = privacy_problem(cfg.privacy, cfg.aggregation.rule, cfg.aggregation.clip,
                              num_nodes, cfg.aggregation.server_opt)
    if problem:
        raise PlasticError(problem)
    if cfg.privacy.secagg:
        secagg_rounds(grid, strategy, theta, num_rounds, cfg, num_nodes)
        return
    with_privacy(strategy, cfg, num_nodes).start(
        grid=grid, initial_arrays=pack_theta(theta, "float32"), num_rounds=num_rounds,
        timeout=cfg.federation.round_timeout, train_config=ConfigRecord(),
        evaluate_config=ConfigRecord())
