"""A user's own text as FedNL's data: .txt, .jsonl and .csv files read as documents, dealt
IID to clients that train on next-token loss and are scored by next-token accuracy on
documents they never saw; bad files refused in one line."""

import json
from pathlib import Path

import pytest
import torch

from plasticlm.config import load_config
from plasticlm.data.text_sources import load_documents
from plasticlm.errors import PlasticError
from plasticlm.fednl.clients import text_tasks
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.task import LMTask
from plasticlm.models import build_tiny, train_bpe_tokenizer

TINYSTORIES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "tinystories" \
    / "tinystories_sample.txt"
STORIES = [f"Tom had a red ball number {i}. He liked to play with it in the park." for i in
           range(24)]


def test_each_layout_reads_the_same_documents(tmp_path):
    (tmp_path / "a.txt").write_text("<|endoftext|>".join(STORIES))
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": s}) for s in STORIES))
    (tmp_path / "b.jsonl").write_text("\n".join(
        json.dumps({"prompt": s[:10], "response": s[10:]}) for s in STORIES))
    (tmp_path / "a.csv").write_text("id,text\n" + "\n".join(f'{i},"{s}"'
                                                            for i, s in enumerate(STORIES)))
    for name in ("a.txt", "a.jsonl", "a.csv"):
        assert load_documents(tmp_path / name) == STORIES, name
    assert load_documents(tmp_path / "b.jsonl")[0] == STORIES[0][:10] + "\n" + STORIES[0][10:]


@pytest.mark.parametrize("name, text, refusal", [
    ("x.jsonl", '{"txt": "a"}\n', "line 1: needs a string 'text'"),
    ("x.jsonl", '["a"]\n', "line 1: expected a JSON object"),
    ("x.csv", "id,body\n1,a\n", "no 'text' column"),
    ("x.txt", "  \n", "holds no text"),
])
def test_a_bad_text_file_is_refused_in_one_line(tmp_path, name, text, refusal):
    (tmp_path / name).write_text(text)
    with pytest.raises(PlasticError, match=refusal) as e:
        load_documents(tmp_path / name)
    assert "\n" not in str(e.value)


def test_the_config_takes_a_text_file_only_split_iid(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(json.dumps({"text": s}) for s in STORIES))
    cfg = load_config(FedNLConfig, None, [f"data.source={path}", "data.split=iid"])
    assert cfg.data.split == "iid"
    with pytest.raises(PlasticError, match="is a text file: its documents are split iid"):
        load_config(FedNLConfig, None, [f"data.source={path}"])
    with pytest.raises(PlasticError, match="iid deals out the documents of a text file"):
        load_config(FedNLConfig, None, ["data.split=iid"])


def test_clients_hold_disjoint_documents_and_train_on_every_next_token(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("<|endoftext|>".join(STORIES))
    tasks = text_tasks(path, 3, seed=1, window=16)
    docs = [d for t in tasks for d in t.train + t.test]
    assert sorted(docs) == sorted(STORIES) and len(set(docs)) == len(docs)
    assert all(t.test and not set(t.test) & set(t.train) for t in tasks)
    tok = train_bpe_tokenizer(STORIES, vocab_size=200)
    ids, labels = next(tasks[0].batches(tok, 1, 4, seed=0))
    assert ids.shape == labels.shape and ids.shape[0] == 4 and ids.shape[1] <= 17
    assert torch.equal(ids[labels != -100], labels[labels != -100])


def test_next_token_accuracy_rises_when_the_model_learns_the_text():
    """Scored on held-out documents of the same kind: a model trained on the training
    documents beats the untrained one (fails if the labels were shifted or dropped)."""
    tok = train_bpe_tokenizer(STORIES, vocab_size=200)
    task = LMTask("c", "text", STORIES[:20], STORIES[20:], window=24)
    torch.manual_seed(0)
    model = build_tiny("llama", vocab_size=len(tok), hidden_size=32, num_layers=2,
                       num_heads=2, num_kv_heads=1)
    before = task.accuracy(model, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for ids, labels in task.batches(tok, 60, 8, seed=0):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    after = task.accuracy(model, tok)
    assert after > before + 0.3, (before, after)
    assert len(task.groups()) == len(task.correct(model, tok))


@pytest.mark.skipif(not TINYSTORIES.is_file(), reason="the shared TinyStories sample is absent")
def test_the_tinystories_sample_makes_five_clients():
    tasks = text_tasks(TINYSTORIES, 5, max_train=40, max_test=5)
    assert len(tasks) == 5 and all(len(t.train) == 40 and len(t.test) == 5 for t in tasks)


STORIES260K = TINYSTORIES.parents[1] / "models" / "stories260K"


@pytest.mark.slow
@pytest.mark.skipif(not (TINYSTORIES.is_file() and STORIES260K.is_dir()),
                    reason="the shared TinyStories sample or stories260K is absent")
def test_fednl_runs_a_round_on_a_real_checkpoint_and_ones_own_text(tmp_path):
    """`fednl run` with a checkpoint no one here wrote (stories260K, imported) and the
    TinyStories text file: one round on Flower's simulation runtime, exit 0, a summary."""
    from plasticlm.cli import main

    model = tmp_path / "stories260K"
    assert main(["models", "import-llama2c", str(STORIES260K / "stories260K.bin"),
                 str(STORIES260K / "tok512.bin"), str(model)]) == 0
    assert main(["fednl", "run", "--set", f"model={model}", "--set",
                 f"data.source={TINYSTORIES}", "--set", "data.split=iid", "--set",
                 "data.num_clients=2", "--set", "train.rounds=1", "--set", "train.local_steps=2",
                 "--set", "train.batch_size=4", "--set", "data.max_train=32", "--set",
                 "data.max_test=4", "--set", "method.window=32", "--set", "name=byo", "--set",
                 f"outputs.out={tmp_path / 'runs'}"]) == 0
    summary = json.loads((tmp_path / "runs" / "byo" / "summary.json").read_text())
    assert 0 < summary["mean_fed_acc"] < 1
