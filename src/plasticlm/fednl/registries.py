"""FedNL's extension points, one registry each: what theta is and how a client trains it
(``FEDERATED_METHODS``: :mod:`plasticlm.fednl.methods`), how the server combines the clients' theta
(``AGGREGATORS``: :mod:`plasticlm.fednl.aggregators`) and what turns the round's aggregate
into theta's step (``SERVER_OPTIMIZERS``: :mod:`plasticlm.fednl.server_opt`).

Each member registers itself where it is defined; :mod:`plasticlm.fednl.config` imports
those modules, so a loaded run config always sees every member.
"""

from __future__ import annotations

from plasticlm.registry import Registry

FEDERATED_METHODS = Registry("federated method")
AGGREGATORS = Registry("aggregation rule")
SERVER_OPTIMIZERS = Registry("server optimiser")
