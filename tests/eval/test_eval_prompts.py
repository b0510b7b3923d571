"""The one QA prompt template: every method asks in it, so none can drift from the others."""

from types import SimpleNamespace

import pytest

import plasticlm.eval.multiple_choice as mc
import plasticlm.experiments.scol.longbench as scol_longbench
import plasticlm.fednl.task as fednl_task
from plasticlm.data.mmlu import write_mmlu
from plasticlm.data.records import MCQuestion
from plasticlm.eval import MCConfig, choice_scores, qa_continuation, qa_line, qa_prompt
from plasticlm.experiments.refine.experiment import ExperimentConfig, load_questions
from plasticlm.refine.examples import make_examples
from plasticlm.scol.rewards import qa_prompt as scol_qa_prompt

QUESTION = "Which organ does Kalomira act on?"
CHOICES = ("liver", "heart", "lungs", "skin")
ITEM = MCQuestion("pharmacology", "test", QUESTION, CHOICES, "A")


class Recorder:
    """Stands in for ``encode_pair`` and ``score_continuations``: records the texts a scorer
    builds and scores choice i as -i (so choice 0 wins)."""

    def __init__(self):
        self.pairs: list[tuple[str, str]] = []

    def encode_pair(self, tokenizer, prompt, continuation):
        self.pairs.append((prompt, continuation))
        return [len(self.pairs)], [0]

    def score_continuations(self, model, contexts, conts, *args, **kwargs):
        return [SimpleNamespace(logprob=-float(i), mean_logprob=-float(i))
                for i in range(len(contexts))]


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    for module in (mc,):
        monkeypatch.setattr(module, "encode_pair", rec.encode_pair)
        monkeypatch.setattr(module, "score_continuations", rec.score_continuations)
        monkeypatch.setattr(module, "pad_id_of", lambda tokenizer: 0)
    return rec


def expected_pairs(question: str = QUESTION) -> list[tuple[str, str]]:
    return [(qa_prompt(question), qa_continuation(c)) for c in CHOICES]


def test_the_template_is_the_pretraining_format():
    assert qa_prompt(QUESTION) == "Q: Which organ does Kalomira act on? A:"
    assert qa_line(QUESTION, "liver") == "Q: Which organ does Kalomira act on? A: liver."
    assert qa_continuation("liver") == " liver"
    assert qa_line(QUESTION, "liver") == qa_prompt(QUESTION) + qa_continuation("liver") + "."
    # a question with braces is used as given, not read as a format string
    assert qa_prompt("What is {x}?") == "Q: What is {x}? A:"


def test_mc_continuation_scoring_asks_in_the_template(recorder):
    assert MCConfig().continuation_template.format(question=QUESTION) == qa_prompt(QUESTION)
    scores = choice_scores(None, None, [QUESTION], [CHOICES], MCConfig(method="continuation"))
    assert recorder.pairs == expected_pairs() and len(scores[0]) == len(CHOICES)


def test_fednl_clients_train_and_are_evaluated_in_the_template(monkeypatch, recorder):
    task = fednl_task.ClientTask("c0", "stem", [ITEM], [ITEM])
    assert task.pairs() == [(qa_prompt(QUESTION), qa_continuation("liver"))]
    assert task.accuracy(None, None) == 1.0   # choice 0 (the answer) scores highest
    assert recorder.pairs == expected_pairs()


def test_scol_asks_in_the_template(recorder):
    assert scol_qa_prompt(QUESTION) == qa_prompt(QUESTION)
    assert scol_qa_prompt(QUESTION, prefix="Notes.\n") == "Notes.\n" + qa_prompt(QUESTION)
    item = SimpleNamespace(question=QUESTION, choices=CHOICES, answer="A")
    assert scol_longbench._mc_correct(None, None, item)
    assert recorder.pairs == expected_pairs()


def test_refine_asks_in_the_template(tmp_path):
    write_mmlu(tmp_path, [MCQuestion("pharmacology", split, QUESTION, CHOICES, "A")
                          for split in ("dev", "val", "test")])
    train, test, prompt_fn = load_questions(ExperimentConfig(mmlu=str(tmp_path)))
    assert prompt_fn(QUESTION) == qa_prompt(QUESTION)
    [example] = make_examples(test, prompt_fn)
    assert (example.prompt, example.answer) == (qa_prompt(QUESTION), qa_continuation("liver"))
