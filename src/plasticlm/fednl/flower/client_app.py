"""The FedNL ClientApp (Flower Message API): trains and evaluates theta on the client's own
data.

Personal state (FedALA weights, SI importances, the previous local theta) lives in the
client's ``context.state`` and, so that a resumed run can find it, in the client's own
state folder; the server never sees it.
"""

from __future__ import annotations

import time
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from plasticlm.config import override
from plasticlm.fednl.build import model_for, tasks_for
from plasticlm.fednl.config import run_of
from plasticlm.fednl.flower.checkpoint import (
    client_state_root,
    load_client_state,
    save_client_state,
)
from plasticlm.fednl.flower.messages import pack_theta, unpack_theta
from plasticlm.fednl.flower.privacy_client import privacy_mod
from plasticlm.fednl.local_round import local_update
from plasticlm.fednl.registries import FEDERATED_METHODS
from plasticlm.fednl.theta import set_theta
from plasticlm.runtime import dtype_name, set_threads

# the run's privacy settings (Flower's clipping and SecAgg+ mods) wrap training messages
client_app = ClientApp(mods=[privacy_mod])


# What a node says in its own --node-config wins over the run config: a node loads the model
# and data it was set up with and writes its state where it chose, whatever the run asks (the
# run's paths only fill in what a node leaves unsaid, as in the simulation).
NODE_KEYS = {"model": "model", "data": "data.source"}


def _client(msg: Message, context: Context):
    set_threads()  # the thread policy: 1 in the simulation and on local SuperNodes (runtime.py)
    cfg, run_dir = run_of(context)   # Flower's run config: once per run, not per message
    own = {key: str(context.node_config[node_key]) for node_key, key in NODE_KEYS.items()
           if node_key in context.node_config}
    if own:
        cfg = override(cfg, own)
    pid = int(context.node_config["partition-id"])
    tasks = tasks_for(cfg)
    if not 0 <= pid < len(tasks):
        raise ValueError(f"partition-id {pid} out of range: the run has {len(tasks)} clients")
    model, tokenizer = model_for(cfg)
    return cfg, run_dir, pid, tasks[pid], model, tokenizer


def _reply(msg: Message, arrays: ArrayRecord | None, metrics: dict, task, model) -> Message:
    param = next(model.parameters())  # the base model's: where and in what the client ran
    runtime = f"{param.device} {dtype_name(param.dtype)}"
    content = RecordDict({"metrics": MetricRecord(metrics),
                          "client": ConfigRecord({"name": task.name, "domain": task.domain,
                                                  "runtime": runtime})})
    if arrays is not None:
        content["arrays"] = arrays
    return Message(content, reply_to=msg)


def _state_dir(cfg, run_dir, pid: int, context: Context) -> Path:
    return Path(str(context.node_config.get("state-dir")
                    or client_state_root(cfg, run_dir))) / f"client{pid}"


def _personal_state(context: Context, state_dir: Path, after_round: int) -> dict:
    if "personal" in context.state:
        return unpack_theta(context.state["personal"])
    # a fresh process (first round, or a resumed run): read the client's own disk
    return load_client_state(state_dir, after_round)


@client_app.train()
def client_train(msg: Message, context: Context) -> Message:
    """Local training from the received theta; replies with the local theta and the local
    model's accuracy (the "before aggregation" side of the aggregation drop)."""
    cfg, run_dir, pid, task, model, tokenizer = _client(msg, context)
    rnd = int(msg.content["config"]["server-round"])
    state_dir = _state_dir(cfg, run_dir, pid, context)
    state = _personal_state(context, state_dir, rnd - 1)
    t0 = time.time()
    theta, metrics = local_update(model, tokenizer, task, unpack_theta(msg.content["arrays"]), state,
                                  cfg, seed=cfg.seed * 100_003 + rnd * 101 + pid)
    if cfg.eval.local_eval == "every" or rnd == cfg.train.rounds:
        metrics["local-acc"] = task.accuracy(model, tokenizer)
    if state:
        context.state["personal"] = ArrayRecord(state)
        save_client_state(state_dir, rnd, state)
    metrics.update({"num-examples": len(task.pairs()), "partition-id": pid,
                    "train-seconds": time.time() - t0})
    return _reply(msg, pack_theta(theta, cfg.federation.transfer_dtype), metrics, task, model)


@client_app.evaluate()
def client_evaluate(msg: Message, context: Context) -> Message:
    """Accuracy of the received aggregate on the client's held-out questions (with the
    client's own share of theta where the method keeps one, :meth:`FedMethod.personalise`)."""
    cfg, run_dir, pid, task, model, tokenizer = _client(msg, context)
    rnd = int(msg.content["config"]["server-round"])
    state = _personal_state(context, _state_dir(cfg, run_dir, pid, context), rnd)
    set_theta(model, FEDERATED_METHODS[cfg.method.name]().personalise(unpack_theta(msg.content["arrays"]),
                                                            state))
    acc = task.accuracy(model, tokenizer)
    return _reply(msg, None, {"num-examples": len(task.test), "partition-id": pid,
                              "fed-acc": acc}, task, model)
