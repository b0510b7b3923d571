"""The client side of FedNL's ``privacy`` settings: one ClientApp mod that applies Flower's
own mods as the run asks, read from the run config like every other setting.

- ``client-fixed`` / ``client-adaptive``: Flower's ``fixedclipping_mod`` /
  ``adaptiveclipping_mod`` clip the local update to the norm the server's DP wrapper sends.
- ``secagg``: Flower's ``secaggplus_mod`` answers the SecAgg+ stages and masks the reply. It
  speaks the legacy records (``fitins.*`` in, ``fitres.*`` out); :func:`legacy_train` turns
  them into FedNL's Message-API train message and back, theta's names travelling in the fit
  config (legacy ``Parameters`` carry none).

Only training messages pass through these mods; evaluation is unchanged.
"""

from __future__ import annotations

from functools import partial

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod

from plasticlm.fednl.config import run_of
from plasticlm.fednl.privacy import NAMES_KEY

CLIPPING = {"client-fixed": fixedclipping_mod, "client-adaptive": adaptiveclipping_mod}


def in_received_order(msg: Message, context: Context, call_next) -> Message:
    """The reply's theta in the order of the received one (Flower's clipping mods compare
    the two records' key lists)."""
    reply = call_next(msg, context)
    if reply.has_error() or "arrays" not in reply.content.array_records:
        return reply
    sent, got = msg.content["arrays"], reply.content["arrays"]
    if set(sent.keys()) == set(got.keys()):
        reply.content["arrays"] = ArrayRecord({k: got[k] for k in sent.keys()})
    return reply


def legacy_train(msg: Message, context: Context, call_next) -> Message:
    """A legacy fit message (``fitins.parameters``, ``fitins.config``) as FedNL's train
    message (``arrays``, ``config``), and the reply as a legacy ``fitres``: theta in the
    sent names' order, the example count, and the metrics and client record as scalars."""
    config = dict(msg.content["fitins.config"])
    names = [str(n) for n in config.pop(NAMES_KEY)]
    values = list(msg.content["fitins.parameters"].values())
    msg.content = RecordDict({"arrays": ArrayRecord(dict(zip(names, values, strict=True))),
                              "config": ConfigRecord(config)})
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    arrays, metrics = reply.content["arrays"], reply.content["metrics"]
    client = {k: str(v) for k, v in reply.content["client"].items()}
    reply.content = RecordDict({
        "fitres.parameters": ArrayRecord({n: arrays[n] for n in names}),
        "fitres.num_examples": MetricRecord({"num_examples": int(metrics["num-examples"])}),
        "fitres.metrics": ConfigRecord({**dict(metrics), **client}),
        "fitres.status": ConfigRecord({"code": 0, "message": "Success"})})
    return reply


def privacy_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower's clipping and SecAgg+ mods around a training message, as the run's
    ``privacy`` section asks; every other message passes untouched."""
    p = run_of(context)[0].privacy
    if msg.metadata.message_type != MessageType.TRAIN or not (p.secagg or p.mode in CLIPPING):
        return call_next(msg, context)
    chain = call_next
    if p.mode in CLIPPING:   # innermost: it clips the update FedNL's client returns
        chain = partial(CLIPPING[p.mode], call_next=partial(in_received_order,
                                                            call_next=chain))
    if p.secagg:             # outermost: it masks what the clipping left
        chain = partial(secaggplus_mod, call_next=partial(legacy_train, call_next=chain))
    return chain(msg, context)
