import os
from pathlib import Path

import pytest

from plasticlm import cpu

# The tests compute on the float path the command uses (the sandbox family's), pinned before
# torch loads.
cpu.configure()

from plasticlm.env import THREADS_ENV  # noqa: E402
from plasticlm.runtime import set_threads, threads  # noqa: E402

# Tests never reach a hub: a missing model must fail fast, not try the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The thread policy: 2 torch threads unless $PLASTICLM_THREADS says otherwise; in the
# environment, so that code under test calling set_threads() and subprocesses agree.
os.environ.setdefault(THREADS_ENV, "2")
set_threads()

ROOT = Path(__file__).resolve().parents[1]


def _shared_data() -> Path:
    env = os.environ.get("PLASTICLM_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder (../shared/data); tests using it skip when it is absent."""
    path = _shared_data()
    if not path.is_dir():
        pytest.skip(f"real data folder {path} is absent (set PLASTICLM_DATA to point to it)")
    return path


@pytest.fixture(autouse=True, scope="session")
def _isolated_home(tmp_path_factory):
    """One cache home for the whole session, out of the user's ~/.cache. Session-scoped so
    that it is in place before any module-scoped fixture (and inherited by subprocesses)."""
    old = os.environ.get("PLASTICLM_HOME")
    os.environ["PLASTICLM_HOME"] = str(tmp_path_factory.getbasetemp() / "plasticlm_home")
    yield
    if old is None:
        os.environ.pop("PLASTICLM_HOME", None)
    else:
        os.environ["PLASTICLM_HOME"] = old


@pytest.fixture(scope="module")
def one_thread():
    """One torch intra-op thread for a test module, restored after it."""
    with threads(1):
        yield


@pytest.fixture(scope="session")
def tiny_squad_world(tmp_path_factory):
    """``make(passages, name, extra_texts=(), **model_sizes) -> (folder, model, tok)``: a
    300-token BPE tokenizer fit to the passages (texts, QA lines, ``extra_texts``) and an
    untrained tiny Qwen3 (3 layers x 32 unless sizes say otherwise), saved in
    ``folder/model`` beside the passages as ``folder/squad.json``."""
    def make(passages, name, extra_texts=(), **sizes):
        from plasticlm.data.squad import write_squad
        from plasticlm.eval import qa_line
        from plasticlm.models import build_tiny, train_bpe_tokenizer

        texts = [p.context for p in passages] * 3 + list(extra_texts) + [
            qa_line(q.question, q.answers[0].text) for p in passages for q in p.qas]
        tok = train_bpe_tokenizer(texts, vocab_size=300)
        model = build_tiny("qwen3", seed=0, vocab_size=len(tok), **{
            "hidden_size": 32, "num_layers": 3, "num_heads": 2, "num_kv_heads": 1,
            "head_dim": 16, "intermediate_size": 64, **sizes}).eval()
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder / "model")
        tok.save_pretrained(folder / "model")
        write_squad(folder / "squad.json", passages)
        return folder, model, tok
    return make


# The SCoL tests' contexts: six made-up drugs, each a two-sentence passage with two
# closed-book questions (what it treats, who makes it) answered in it.
DRUGS = [("Tamasartan", "glaucoma", "Orvane Labs"), ("Velizole", "asthma", "Keltis Pharma"),
         ("Quinomab", "gout", "Munder Bio"), ("Lorepril", "eczema", "Pyrrha Labs"),
         ("Dexastatin", "anemia", "Caddis Medical"), ("Fenovir", "vertigo", "Tolland Pharma")]


@pytest.fixture(scope="session")
def drug_passages():
    """The six :data:`DRUGS` as SQuAD-format passages, in that order."""
    from plasticlm.data.records import QA, Answer, Passage

    out = []
    for name, cond, maker in DRUGS:
        text = f"Doctors prescribe {name} for {cond}. {name} is made by {maker}."
        out.append(Passage(name, text, (
            QA(f"{name}.t", f"What condition is {name} used to treat?",
               (Answer(cond, text.index(cond)),)),
            QA(f"{name}.m", f"Which company makes {name}?", (Answer(maker, text.index(maker)),)))))
    return out
