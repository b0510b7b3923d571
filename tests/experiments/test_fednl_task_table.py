"""NIAH-7 per task: each task's accuracy from the items its groups name, the macro mean, and
the tasks a row wins over the untrained-memory control."""

import pytest

from plasticlm.experiments.fednl.task_table import CONTROL, per_task_table, task_scores, tasks_of


def _run(single: list[float], uuid: list[float]) -> dict:
    # items interleaved, as clients' items are not in task order in every run
    correct, groups = [], []
    for i in range(max(len(single), len(uuid))):
        if i < len(single):
            correct.append(single[i])
            groups.append(f"single/s{i}")
        if i < len(uuid):
            correct.append(uuid[i])
            groups.append(f"uuid/s{i}")
    return {"correct": correct, "groups": groups}


def test_a_task_is_scored_on_its_own_items_only():
    runs = [_run([1, 1, 1, 0], [0, 0, 0, 0])]
    assert tasks_of(runs) == ["single", "uuid"]
    assert task_scores(runs, "single")[0] == [[1, 1, 1, 0]]
    assert task_scores(runs, "uuid")[1] == [["uuid/s0", "uuid/s1", "uuid/s2", "uuid/s3"]]


def test_per_task_table_counts_the_tasks_above_the_untrained_memory_control():
    """FedNL is far above the control on 'single' in every seed and equal on 'uuid': 1/2."""
    n = 40
    fednl = [_run([1.0] * n, [float(i % 4 == 0) for i in range(n)]) for _ in range(3)]
    control = [_run([float(i % 4 == 0) for i in range(n)],
                    [float(i % 4 == 0) for i in range(n)]) for _ in range(3)]
    table = per_task_table({"fednl": {"runs": fednl}, CONTROL: {"runs": control}})
    lines = [ln for ln in table.splitlines() if ln.startswith("| fednl |")]
    assert lines and lines[0].rstrip(" |").endswith("1/2")
    assert "| row | single | uuid | mean over tasks | tasks above the control |" in table
    # the macro mean of fednl: (100 + 25) / 2
    assert "62.5" in lines[0]


def test_without_the_control_row_there_is_no_control_column():
    table = per_task_table({"fednl": {"runs": [_run([1, 0], [0, 1])]}})
    assert "tasks above the control" not in table
    assert table.splitlines()[2].startswith("| fednl | 50.0")


@pytest.mark.parametrize("label", [CONTROL])
def test_the_control_row_is_not_compared_with_itself(label):
    runs = [_run([1, 0, 1], [0, 1, 0]) for _ in range(2)]
    table = per_task_table({label: {"runs": runs}})
    assert table.splitlines()[2].rstrip().endswith("| - |")


def test_the_niah_table_ends_with_the_per_task_table_when_items_name_their_task():
    from plasticlm.experiments.fednl.experiment import accuracy_table
    from plasticlm.experiments.fednl.variants import ExperimentConfig

    cfg = ExperimentConfig(experiment="niah", seeds=1, rows=("fednl",))
    runs = {f"{label}|0": {**_run([1, 0, 1, 1], [0, 0, 1, 0]), "theta_bytes": 1000}
            for label in ("fednl", "fedavg LoRA, window")}
    table = accuracy_table(cfg, {"runs": runs})
    assert "| row | single | uuid | mean over tasks |" in table
    # items without a task in their group (older results): no per-task table
    for r in runs.values():
        r["groups"] = list(range(len(r["correct"])))
    assert "mean over tasks" not in accuracy_table(cfg, {"runs": runs})
