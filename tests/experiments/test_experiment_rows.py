"""Experiment rows as files: the packaged FedNL rows, a user's own rows file, and every bad
row refused in one line when the experiment config is loaded."""

import pytest

from plasticlm.config import override
from plasticlm.errors import PlasticError
from plasticlm.experiments.fednl.variants import ExperimentConfig, variants
from plasticlm.experiments.rows import load_rows, rows_path


def test_rows_scale_with_the_base_run_and_read_the_experiments_own_keys():
    cfg = override(ExperimentConfig(experiment="niah"),
                   {"run.train.rounds": 5, "run.method.lora_rank": 4,
                    "closed_book_row_share": 0.4})
    rows = {v.label: dict(v.changes) for v in variants(cfg)}
    assert rows["fednl, 3x rounds"]["train.rounds"] == 15
    assert rows["fednl, LoRA rank x4"]["method.lora_rank"] == 16
    assert rows["fednl, with closed-book questions"]["data.closed_book_share"] == 0.4
    assert rows["fedavg LoRA, full attention"] == {"method.name": "fedavg", "method.window": 0,
                                                   "train.segment_tokens": 0}


def test_every_packaged_rows_file_loads():
    for experiment in ("mmlu", "niah", "openbook"):
        assert load_rows(rows_path("fednl", experiment), ("closed_book_pool",))


def test_a_users_rows_file_replaces_the_packaged_rows(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[[row]]\nlabel = "fednl, window 32"\n'
                    'set = { "method.name" = "fednl", "method.window" = 32 }\n\n'
                    '[[row]]\nlabel = "fedavg LoRA, window"\nset = { "method.name" = "fedavg" }\n')
    cfg = ExperimentConfig(experiment="openbook", rows_file=str(path))
    rows = variants(cfg)
    assert [v.label for v in rows] == ["fednl, window 32", "fedavg LoRA, window"]
    assert [v.window for v in rows] == [32, 16]


@pytest.mark.parametrize("text, refusal", [
    ('[[row]]\nlabel = "a"\nsett = {}\n', "unknown keys \\['sett'\\]"),
    ('[[row]]\nlabel = "a"\n\n[[row]]\nlabel = "a"\n', "label 'a' is given twice"),
    ('[[row]]\nset = {}\n', "needs a label"),
    ('[[row]]\nlabel = "a"\nset = { "train.rounds" = { twice = 2 } }\n',
     "a table value is \\{ times = <number> \\}"),
    ('[[row]]\nlabel = "a"\nwhen = "sunny"\n', "unknown condition 'sunny'"),
    ('[[row]]\nlabel = "a"\ntrained = "no"\n', "trained must be true or false"),
    ('label = "a"\n', "expected one or more \\[\\[row\\]\\] tables"),
    ('[[row]\n', "rows file"),
])
def test_a_bad_rows_file_is_refused_at_load_in_one_line(tmp_path, text, refusal):
    path = tmp_path / "rows.toml"
    path.write_text(text)
    with pytest.raises(PlasticError, match=refusal) as e:
        ExperimentConfig(experiment="niah", rows_file=str(path))
    assert "\n" not in str(e.value)


def test_a_missing_rows_file_and_an_experiment_without_rows_are_refused(tmp_path):
    with pytest.raises(PlasticError, match="rows file .*nope.toml"):
        ExperimentConfig(rows_file=str(tmp_path / "nope.toml"))
    with pytest.raises(PlasticError, match="'stream' has no rows file"):
        variants(ExperimentConfig(experiment="stream"))
