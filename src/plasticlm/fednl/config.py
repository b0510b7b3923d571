"""The configuration of a federated run (a dataclass, loadable from TOML/YAML + overrides)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from plasticlm.config import from_dict, require_positive
from plasticlm.errors import PlasticError
from plasticlm.fednl.methods import MethodConfig
from plasticlm.fednl.robust import AggregationConfig


@dataclass
class FedNLConfig:
    """Everything a federated run needs; the server sends it to every client as JSON."""

    name: str = "fednl-sandbox"
    model: str = "sandbox:receiver"   # "<preset>:<model>" (sandbox, quick) or an HF folder / hub id
    data: str = "sandbox"             # "sandbox" (the world) or a world / MMLU folder
    split: str = "domain"             # domain (5 clients) | dirichlet | niah (7 clients) |
                                      # openbook (5 clients, sandbox worlds only)
    num_clients: int = 5              # dirichlet only; domain always has 5
    alpha: float = 0.5                # Dirichlet concentration
    max_train: int = 96               # training questions per client (cap)
    max_test: int = 48                # held-out questions per client (cap)
    niah_length: int = 192            # niah: prompt length in tokens of the model's tokenizer
    closed_book_share: float = 0.0    # niah / openbook: this share of each client's training
                                      # pairs are closed-book questions (the short-context skill)
    rounds: int = 4
    seed: int = 0
    min_clients: int = 2              # fewer valid replies than this fails the round
    round_timeout: float = 900.0      # seconds to wait for replies
    local_eval: str = "every"         # every | last: rounds whose clients also score their
                                      # local model (the aggregation drop); "last" saves time
    client_cpus: int = 1              # simulation: CPUs (and torch threads) per client process;
                                      # each process holds one frozen base that its clients
                                      # share: 2 on 2 cores runs the clients in turn in one
                                      # process, one base copy in all (real shapes on a CPU)
    transfer_dtype: str = "float32"   # float32 | float16: what theta travels as
    client_state_dir: str = ""        # where clients keep personal state (default: run/clients)
    out: str = "runs"
    method: MethodConfig = field(default_factory=MethodConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)

    def __post_init__(self):
        require_positive(self, "client_cpus", "rounds", "max_train", "max_test", "min_clients",
                         "num_clients", "round_timeout", "niah_length")
        if not 0 <= self.closed_book_share < 1:
            raise PlasticError(f"closed_book_share must be in [0, 1), not "
                               f"{self.closed_book_share}")
        if self.closed_book_share and self.split not in ("niah", "openbook"):
            raise PlasticError("closed_book_share mixes closed-book questions into niah or "
                               f"openbook clients; the {self.split!r} clients are closed-book "
                               "already: leave it at 0")
        # the run folder is out/name: an empty name would make it `out` itself
        if not isinstance(self.name, str) or self.name.strip(". ") == "" or \
                any(c in self.name for c in "/\\"):
            raise PlasticError(f"config name {self.name!r} must be a folder name: not empty, "
                               "no '/'")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FedNLConfig:
        return from_dict(cls, json.loads(text))
