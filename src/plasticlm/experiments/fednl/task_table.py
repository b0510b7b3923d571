"""NIAH-7 per task, as the paper's table has it: each row's accuracy on each client's task,
its macro mean, and how many tasks it wins over the untrained-memory control.

A run's items carry groups ``"<task>/<sample>"`` (:func:`plasticlm.experiments.fednl.experiment._score`),
so a task's items are found by prefix; intervals are bootstrap over the task's items
clustered by sample and pooled over seeds, differences paired on the same items.
"""

from __future__ import annotations

from collections.abc import Mapping

from plasticlm.eval import format_ci, paired_intervals, pooled_bootstrap_ci, seed_ci, verdict

CONTROL = "fednl, untrained memory"


def has_tasks(runs: list[dict]) -> bool:
    """Whether the runs' items name their task (``"<task>/<sample>"`` groups)."""
    return all(isinstance(g, str) and "/" in g for r in runs for g in r["groups"])


def tasks_of(runs: list[dict]) -> list[str]:
    """The tasks of a row's runs, in the order their items come."""
    seen: dict[str, None] = {}
    for g in runs[0]["groups"]:
        seen.setdefault(g.split("/", 1)[0], None)
    return list(seen)


def task_scores(runs: list[dict], task: str) -> tuple[list[list[float]], list[list[str]]]:
    """Per seed, the ``task``'s item scores and their groups."""
    scores, groups = [], []
    for r in runs:
        idx = [i for i, g in enumerate(r["groups"]) if g.split("/", 1)[0] == task]
        scores.append([r["correct"][i] for i in idx])
        groups.append([r["groups"][i] for i in idx])
    return scores, groups


def per_task_table(rows: Mapping[str, Mapping], control: str = CONTROL) -> str:
    """Markdown: a row per variant (``rows[label]["runs"]``), a column per task, the mean
    over tasks [95% CI over seeds] and, when ``control`` is a row, the tasks where the row is
    above it ('better' by the paired item interval and the seeds' interval)."""
    labels = list(rows)
    tasks = tasks_of(rows[labels[0]]["runs"])
    has_control = control in rows
    head = ["row", *tasks, "mean over tasks"] + (["tasks above the control"]
                                                 if has_control else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in labels:
        runs = rows[label]["runs"]
        cells, wins = [], 0
        for task in tasks:
            scores, groups = task_scores(runs, task)
            cells.append(format_ci(pooled_bootstrap_ci(scores, groups_per_seed=groups)))
            if has_control and label != control:
                base, _ = task_scores(rows[control]["runs"], task)
                pooled, seeds = paired_intervals(scores, base, groups)
                wins += verdict(pooled, over_seeds=seeds) == "better"
        per_seed = [sum(sum(s) / len(s) for s in
                        (task_scores([r], t)[0][0] for t in tasks)) / len(tasks) for r in runs]
        cells.append(format_ci(seed_ci(per_seed)))
        if has_control:
            cells.append("-" if label == control else f"{wins}/{len(tasks)}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("\nPer task: accuracy [95% CI], bootstrap over the task's items clustered by "
                 "sample, pooled over seeds; mean over tasks: the macro mean, its interval over "
                 "seeds ('[n=1]': one seed)."
                 + (f" Control: '{control}' (the memory as initialised, never trained); a task "
                    "counts as above it when the paired difference on its items and the seeds' "
                    "interval both exclude 0 on the positive side." if has_control else ""))
    return "\n".join(lines)
