"""Non-IID client partitions: by domain (MMLU's 57 subjects -> 5 domains), by NIAH task,
and Dirichlet(alpha) over labels or domains."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from plasticlm.data.niah import TASKS
from plasticlm.errors import PlasticError

CLIENT_DOMAINS = ("stem", "math_cs", "humanities", "social_sciences", "other")

# FedNL's five clients. MMLU's own "STEM" category is split in two: mathematics, statistics
# and computing go to math_cs, the natural sciences and engineering stay in stem.
MMLU_CLIENT_DOMAIN: dict[str, str] = {
    **dict.fromkeys((
        "abstract_algebra", "college_computer_science", "college_mathematics",
        "computer_security", "elementary_mathematics", "high_school_computer_science",
        "high_school_mathematics", "high_school_statistics", "machine_learning"), "math_cs"),
    **dict.fromkeys((
        "anatomy", "astronomy", "college_biology", "college_chemistry", "college_physics",
        "conceptual_physics", "electrical_engineering", "high_school_biology",
        "high_school_chemistry", "high_school_physics"), "stem"),
    **dict.fromkeys((
        "formal_logic", "high_school_european_history", "high_school_us_history",
        "high_school_world_history", "international_law", "jurisprudence", "logical_fallacies",
        "moral_disputes", "moral_scenarios", "philosophy", "prehistory", "professional_law",
        "world_religions"), "humanities"),
    **dict.fromkeys((
        "econometrics", "high_school_geography", "high_school_government_and_politics",
        "high_school_macroeconomics", "high_school_microeconomics", "high_school_psychology",
        "human_sexuality", "professional_psychology", "public_relations", "security_studies",
        "sociology", "us_foreign_policy"), "social_sciences"),
    **dict.fromkeys((
        "business_ethics", "clinical_knowledge", "college_medicine", "global_facts",
        "human_aging", "management", "marketing", "medical_genetics", "miscellaneous",
        "nutrition", "professional_accounting", "professional_medicine", "virology"), "other"),
}


def client_domain(subject: str, mapping: dict[str, str] | None = None) -> str:
    """The client domain of an MMLU (or sandbox-world) subject."""
    mapping = MMLU_CLIENT_DOMAIN if mapping is None else mapping
    if subject not in mapping:
        raise PlasticError(f"subject {subject!r} has no client domain; known subjects: "
                           f"{len(mapping)} (pass a mapping that covers it)")
    return mapping[subject]


def partition_by_domain(subjects: Sequence[str], mapping: dict[str, str] | None = None,
                        domains: Sequence[str] = CLIENT_DOMAINS) -> list[list[int]]:
    """Indices of items per client, one client per domain (order of ``domains``).

    ``subjects[i]`` is item i's subject; ``mapping`` sends subjects to domains.
    """
    where = {d: c for c, d in enumerate(domains)}
    parts: list[list[int]] = [[] for _ in domains]
    for i, s in enumerate(subjects):
        d = client_domain(s, mapping)
        if d not in where:
            raise PlasticError(f"domain {d!r} of subject {s!r} is not among {list(domains)}")
        parts[where[d]].append(i)
    return parts


def partition_by_task(tasks: Sequence[str], task_order: Sequence[str] = TASKS) -> list[list[int]]:
    """One NIAH task per client: client c holds the items whose task is ``task_order[c]``."""
    where = {t: c for c, t in enumerate(task_order)}
    parts: list[list[int]] = [[] for _ in task_order]
    for i, t in enumerate(tasks):
        if t not in where:
            raise PlasticError(f"item {i} has task {t!r}, not one of {list(task_order)}")
        parts[where[t]].append(i)
    return parts


def partition_dirichlet(labels: Sequence[Hashable], num_clients: int, alpha: float,
                        seed: int = 0, min_size: int = 0) -> list[list[int]]:
    """Split item indices over clients with per-label proportions drawn from Dir(alpha).

    Small ``alpha`` (0.1) gives each client few labels; large (100) is close to IID.
    ``labels`` may be answer letters, subjects or domains. Redraws (up to 100 times) until
    every client holds at least ``min_size`` items.
    """
    if num_clients < 1:
        raise PlasticError(f"num_clients must be at least 1, got {num_clients}")
    if alpha <= 0:
        raise PlasticError(f"Dirichlet alpha must be positive, got {alpha}")
    rng = np.random.default_rng(seed)
    groups: dict[Hashable, list[int]] = {}
    for i, lab in enumerate(labels):
        groups.setdefault(lab, []).append(i)
    for _ in range(100):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for lab in sorted(groups, key=str):
            idx = np.array(groups[lab])
            rng.shuffle(idx)
            p = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).round().astype(int)
            for c, chunk in enumerate(np.split(idx, cuts)):
                parts[c].extend(int(x) for x in chunk)
        if min(len(p) for p in parts) >= min_size:
            return [sorted(p) for p in parts]
    raise PlasticError(f"could not give every one of {num_clients} clients {min_size} items "
                       f"in 100 draws of Dir({alpha}); lower min_size or raise alpha")
