"""FedNL's ServerApp rounds and ClientApp (its mods included) in one process: a Flower
``Grid`` whose nodes are calls of the ClientApp, each with its own ``Context`` (partition,
state) and the run's Flower run config. No SuperLink, no Ray; for tests and benchmarks.

Every message is copied on delivery (a node never shares the server's objects) and its
payload counted: the records' bytes (``count_bytes``), without the transport's framing.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable
from pathlib import Path

import torch
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from plasticlm.fednl.build import initial_theta, tasks_for
from plasticlm.fednl.config import RUN_DIR_KEY, FedNLConfig, flower_run_config
from plasticlm.fednl.flower.client_app import client_app
from plasticlm.fednl.flower.server_app import server_main

RUN_ID, SERVER_NODE = 1, 1


def _record_bytes(record) -> int:
    if isinstance(record, ConfigRecord):   # Flower 1.42's count_bytes fails on an empty list
        return ConfigRecord({k: v for k, v in record.items()
                             if not (isinstance(v, list) and not v)}).count_bytes()
    return record.count_bytes()


def payload_bytes(msg: Message) -> int:
    """The bytes of a message's records (0 for an error reply)."""
    return 0 if msg.has_error() else sum(_record_bytes(r) for r in msg.content.values())


class InProcessGrid(Grid):
    """Nodes ``1001 ..`` running ``app``; ``bytes_down`` / ``bytes_up`` / ``messages`` count
    what was sent to and received from them. Used as a context manager: inside, this
    process is the run's ServerApp (Flower's ``TaskIdentity``), as a SuperLink would set."""

    def __init__(self, app: ClientApp, run_config: dict, num_nodes: int):
        self.app = app
        self.contexts = {1001 + pid: Context(run_id=RUN_ID, node_id=1001 + pid,
                                             node_config={"partition-id": pid,
                                                          "num-partitions": num_nodes},
                                             state=RecordDict(), run_config=dict(run_config))
                         for pid in range(num_nodes)}
        self.bytes_down = self.bytes_up = self.messages = 0
        self._identity: tuple = ()

    def __enter__(self) -> InProcessGrid:
        self._identity = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, RUN_ID, SERVER_NODE
        return self

    def __exit__(self, *exc) -> None:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = self._identity

    def set_run(self, run: Run) -> None:
        raise NotImplementedError("the in-process grid serves one run")

    @property
    def run(self) -> Run:
        return Run.create_empty(RUN_ID)

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError("use send_and_receive: nodes answer as they are called")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError("use send_and_receive: nodes answer as they are called")

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> list[Message]:
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            self.bytes_down += payload_bytes(msg)
            delivered = copy.deepcopy(msg)
            try:
                reply = self.app(delivered, self.contexts[msg.metadata.dst_node_id])
            except Exception as e:   # what a SuperNode reports for a failed ClientApp
                reply = Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                      f"{type(e).__name__}: {e}"), reply_to=delivered)
            self.bytes_up += payload_bytes(reply)
            self.messages += 2
            replies.append(reply)
        return replies


def run_in_process(cfg: FedNLConfig, run_dir: str | Path,
                   initial: dict[str, torch.Tensor] | None = None) -> InProcessGrid:
    """Run ``cfg``'s rounds into ``run_dir`` in this process; the grid, with its counts."""
    run_config = {**flower_run_config(cfg), RUN_DIR_KEY: str(run_dir)}
    with InProcessGrid(client_app, run_config, len(tasks_for(cfg))) as grid:
        server_main(grid, cfg, run_dir, initial_theta(cfg) if initial is None else initial)
    return grid
