"""The FedNL strategy: FedAvg's Message-API shape, aggregating theta and nothing else, with
every reply validated before it is read and every finished round checkpointed."""

from __future__ import annotations

import logging
import math
import time

import torch
from flwr.app import Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from plasticlm.fednl.aggregators import robust_aggregate
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.flower.checkpoint import Checkpointer
from plasticlm.fednl.flower.messages import arrays_problem, pack_theta, unpack_theta
from plasticlm.fednl.registries import SERVER_OPTIMIZERS
from plasticlm.fednl.replies import reply_problem

log = logging.getLogger("plasticlm.fednl")


class RoundFailed(RuntimeError):
    """Too few valid replies to aggregate a round; the last checkpoint stays intact."""


class ThetaAverage(FedAvg):
    """FedAvg over theta that validates replies, counts the bytes that travel, tolerates
    failed clients down to ``min_clients``, and checkpoints each finished round."""

    def __init__(self, cfg: FedNLConfig, checkpointer: Checkpointer, start_round: int,
                 num_nodes: int):
        super().__init__(fraction_train=1.0, fraction_evaluate=1.0,
                         min_train_nodes=cfg.federation.min_clients,
                         min_evaluate_nodes=cfg.federation.min_clients,
                         min_available_nodes=num_nodes)
        self.cfg, self.checkpointer, self.offset = cfg, checkpointer, start_round
        self.num_nodes = num_nodes
        self.reference: dict[str, torch.Tensor] = {}
        self.record: dict = {}
        # the server optimiser and its state after the last committed round (resumed from
        # the checkpoint by server_main); a round's new state is kept until it commits
        self.server_opt = SERVER_OPTIMIZERS[cfg.aggregation.server_opt](cfg.aggregation)
        self.server_state: dict[str, torch.Tensor] = {}
        self.pending_state: dict[str, torch.Tensor] = {}

    def _send(self, server_round, arrays, config, grid, kind):
        # the round only: the run config reached every node once, as Flower's run config
        config["server-round"] = server_round + self.offset
        nodes = sorted(grid.get_node_ids())
        msgs = [Message(RecordDict({"arrays": arrays, "config": config}), dst_node_id=n,
                        message_type=kind) for n in nodes]
        self.record.setdefault("bytes_down", 0)
        self.record["bytes_down"] += arrays.count_bytes() * len(msgs)
        self.record[f"sent_{kind}"] = len(msgs)
        return msgs

    @property
    def max_reply_bytes(self) -> int:
        """Theta in float32 twice over, plus room for metadata."""
        return 2 * sum(t.numel() * 4 for t in self.reference.values()) + 65536

    def configure_train(self, server_round, arrays, config, grid):
        self.reference = unpack_theta(arrays)
        self.record = {"round": server_round + self.offset, "t0": time.time()}
        return self._send(server_round, arrays, config, grid, MessageType.TRAIN)

    def configure_evaluate(self, server_round, arrays, config, grid):
        return self._send(server_round, arrays, config, grid, MessageType.EVALUATE)

    def _metrics_problem(self, m: Message, want_arrays: bool, seen: set[int]) -> str | None:
        """Why a reply's metrics and client record cannot be used, or None."""
        metrics = m.content["metrics"]
        needed = ("partition-id", "num-examples", "train_loss") if want_arrays else \
            ("partition-id", "fed-acc")
        missing = [k for k in needed if k not in metrics]
        if missing:
            return f"metrics lack {missing}"
        if "client" not in m.content.config_records or any(
                k not in m.content["client"] for k in ("name", "domain")):
            return "no client record (name, domain)"
        pid = metrics["partition-id"]
        if not isinstance(pid, int) or not 0 <= pid < self.num_nodes:
            return f"partition-id {pid!r} is not one of 0..{self.num_nodes - 1}"
        if pid in seen:
            return f"duplicate partition-id {pid}"
        for key in needed[1:]:
            value = metrics[key]
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                return f"{key} {value!r} is not a finite number"
        if want_arrays and metrics["num-examples"] <= 0:
            return f"num-examples {metrics['num-examples']} is not positive"
        if not want_arrays and not 0.0 <= metrics["fed-acc"] <= 1.0:
            return f"fed-acc {metrics['fed-acc']} is outside [0, 1]"
        return None

    def _size_problem(self, m: Message) -> str | None:
        """A reply larger than theta in float32 (with room for metadata) is refused before
        its arrays become tensors."""
        size = m.content["arrays"].count_bytes()
        return f"reply of {size} bytes, more than the {self.max_reply_bytes} theta can take" \
            if size > self.max_reply_bytes else None

    def _read_theta(self, m: Message) -> tuple[dict | None, str | None]:
        """(theta, None), or (None, the problem): bytes that are not the arrays their headers
        announce (never unpickled), or values theta cannot take (non-finite)."""
        try:
            theta = unpack_theta(m.content["arrays"])
        except (ValueError, TypeError, RuntimeError, EOFError, OSError) as e:
            return None, f"arrays could not be read: {' '.join(str(e).split())[:200]}"
        problem = reply_problem(theta, self.reference)
        return (None, problem) if problem else (theta, None)

    def _valid(self, replies, want_arrays: bool) -> list[tuple[Message, dict | None]]:
        """The acceptable replies, by partition, each with its theta read once (None when
        ``want_arrays`` is false); every other reply is logged and recorded as rejected."""
        ok, seen = [], set()
        for m in replies:
            theta = None
            if m.has_error():
                problem = f"client failed: {m.error.reason[:500]}"
            elif "metrics" not in m.content.metric_records:
                problem = "no metrics record"
            elif want_arrays and "arrays" not in m.content.array_records:
                problem = "no arrays record"
            else:
                problem = self._metrics_problem(m, want_arrays, seen)
                if problem is None and want_arrays:
                    problem = self._size_problem(m) or \
                        arrays_problem(m.content["arrays"], self.reference)
                    if problem is None:
                        theta, problem = self._read_theta(m)
            if problem is None:
                seen.add(int(m.content["metrics"]["partition-id"]))
            if problem:
                log.warning("round %s: rejected reply from node %s: %s", self.record["round"],
                            m.metadata.src_node_id, problem)
                self.record.setdefault("rejected", []).append(problem)
            else:
                ok.append((m, theta))
        return sorted(ok, key=lambda pair: int(pair[0].content["metrics"]["partition-id"]))

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.record["bytes_up"] = sum(m.content["arrays"].count_bytes() for m in replies
                                      if not m.has_error() and "arrays" in m.content.array_records)
        valid = self._valid(replies, want_arrays=True)
        ok = [m for m, _ in valid]
        self.record["missing_train"] = self.record[f"sent_{MessageType.TRAIN}"] - len(replies)
        if len(ok) < self.cfg.federation.min_clients:
            raise RoundFailed(
                f"round {self.record['round']}: only {len(ok)} valid client replies, fewer than "
                f"min_clients={self.cfg.federation.min_clients} (problems: {self.record.get('rejected', [])}, "
                f"missing: {self.record['missing_train']}); the checkpoint of round "
                f"{self.record['round'] - 1} is intact, rerun with --resume")
        proposed = {}

        def server_step(delta: torch.Tensor) -> torch.Tensor:
            step, proposed["state"] = self.server_opt.propose(delta, self.server_state,
                                                              self.record["round"])
            return step

        theta, info = robust_aggregate(
            [theta for _, theta in valid],
            [float(m.content["metrics"]["num-examples"]) for m in ok], self.reference,
            self.cfg.aggregation, max_examples=self.cfg.data.max_train,
            server_step=server_step)
        self.record["aggregation"] = info
        # a refused round leaves the optimiser's state as it was
        self.pending_state = self.server_state if "refused" in info else proposed["state"]
        if "refused" in info:
            log.warning("round %s: aggregate refused, the previous theta is kept: %s",
                        self.record["round"], info["refused"])
        self.record["clients"] = {
            str(m.content["client"]["name"]): {
                "domain": str(m.content["client"]["domain"]),
                "train_loss": float(m.content["metrics"]["train_loss"]),
                **({"local_acc": float(m.content["metrics"]["local-acc"])}
                   if "local-acc" in m.content["metrics"] else {}),
                # the device and dtype the client ran in, as it says (a short label only)
                **({"runtime": str(m.content["client"]["runtime"])[:40]}
                   if "runtime" in m.content["client"] else {}),
            } for m in ok}
        self.aggregate = theta
        # FedNL: the memory's share of each head after aggregation, so a gate that never
        # opens shows in metrics.jsonl
        gates = {k: [round(a, 4) for a in torch.sigmoid(v).tolist()]
                 for k, v in theta.items() if k.endswith("gate_logit")}
        if gates:
            self.record["alpha"] = gates
        arrays = pack_theta(theta, "float32")
        return arrays, MetricRecord({"clients": len(ok)})

    def aggregate_evaluate(self, server_round, replies):
        valid = self._valid(list(replies), want_arrays=False)
        if len(valid) < self.cfg.federation.min_clients:
            raise RoundFailed(
                f"round {self.record['round']}: only {len(valid)} valid evaluation replies, "
                f"fewer than min_clients={self.cfg.federation.min_clients}; the checkpoint of round "
                f"{self.record['round'] - 1} is intact, rerun with --resume")
        for m, _ in valid:
            name = str(m.content["client"]["name"])
            entry = self.record["clients"].setdefault(
                name, {"domain": str(m.content["client"]["domain"])})
            entry["fed_acc"] = float(m.content["metrics"]["fed-acc"])
            if "local_acc" in entry:
                entry["drop"] = entry["local_acc"] - entry["fed_acc"]
        rec = self.record
        rec["seconds"] = time.time() - rec.pop("t0")
        fed = [c["fed_acc"] for c in rec["clients"].values() if "fed_acc" in c]
        rec["mean_fed_acc"] = sum(fed) / len(fed) if fed else float("nan")
        self.checkpointer.commit(rec["round"], self.aggregate, rec, self.pending_state)
        self.server_state = self.pending_state
        log.info(progress_line(rec, self.cfg))
        return MetricRecord({"mean-fed-acc": rec["mean_fed_acc"]})


def progress_line(rec: dict, cfg: FedNLConfig) -> str:
    """One committed round's metrics in a line: the clients' means and the round's costs."""
    def mean(key: str) -> float | None:
        values = [c[key] for c in rec["clients"].values() if key in c]
        return sum(values) / len(values) if values else None

    parts = [f"{cfg.method.name} round {rec['round']}/{cfg.train.rounds}:",
             f"fed acc {rec['mean_fed_acc']:.3f}"]
    for key, label in (("local_acc", "local acc"), ("drop", "drop"),
                       ("train_loss", "train loss")):
        value = mean(key)
        if value is not None:
            parts.append(f"{label} {value:.3f}")
    parts.append(f"({len(rec['clients'])} clients, {rec.get('bytes_up', 0) / 1e6:.2f} MB up, "
                 f"{rec['seconds']:.0f} s)")
    return " ".join(parts[:1] + [", ".join(parts[1:-1])] + parts[-1:])
