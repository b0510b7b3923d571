"""Fuzzed outside input (hypothesis): configs and --set values, the SCoL action parser, the
llama2.c importer, the dataset loaders, fuser and memory adapter folders, theta files and
FedNL run folders. Each input works or raises PlasticError; nothing else is raised, and
sizes a file cannot back are refused before anything is built (no hang, no unbounded
allocation)."""

import argparse
import copy
import csv
import io
import json
import math
import shutil
import struct
import time

import pytest
import torch
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from plasticlm.cli.options import load_from_args
from plasticlm.config import field_docs, load_config, preset_path
from plasticlm.data import (
    load_haystack,
    load_longbench,
    load_mmlu,
    load_niah,
    load_squad,
    load_streams,
    load_text_corpus,
)
from plasticlm.errors import PlasticError
from plasticlm.experiments.fednl.variants import ExperimentConfig as FedNLExperimentConfig
from plasticlm.experiments.memory.mqar_config import MQARConfig
from plasticlm.experiments.refine.experiment import ExperimentConfig as RefineExperimentConfig
from plasticlm.experiments.refine.ladder import TransferConfig
from plasticlm.experiments.scol.calibrate import SweepConfig
from plasticlm.experiments.scol.setup import ExperimentConfig as SCoLExperimentConfig
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.flower.checkpoint import Checkpointer
from plasticlm.memory import attach_memory, from_pretrained, memory_config, save_pretrained
from plasticlm.models import build_tiny
from plasticlm.models.llama2c import llama2c_tokenizer, load_llama2c_model
from plasticlm.refine import Fuser, FuserConfig
from plasticlm.refine.fusers.train import FuserTrainConfig
from plasticlm.sandbox.text import TextPretrainConfig
from plasticlm.sandbox.world import WorldConfig
from plasticlm.scol.policy import format_action, parse_layers
from plasticlm.tensor_files import load_tensors

FUZZ = settings(max_examples=40, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# a size a small file cannot back: refused at once, never allocated
HUGE = 10**9
BOUND_SECONDS = 2.0


def clean(fn, *args, **kwargs):
    """``fn``'s result, or None when it raised the project's error; anything else fails."""
    try:
        return fn(*args, **kwargs)
    except PlasticError:
        return None


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.integers(-3, 8),
                    st.floats(), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=10)
# texts no JSON encoder writes but a file may hold: deep nesting, huge integers, bad UTF-8
NASTY = [b"[" * 5000, b"1" * 5000, b'{"a": ' + b"9" * 5000 + b"}", b"\xff\xfe\x00bad",
         b"\x00" * 16, b'{"a": [' * 2000]
raw = st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                st.sampled_from(NASTY))


def maybe(strategy):
    """The right kind of value mostly, any value sometimes: gets past the first checks."""
    return st.one_of(strategy, strategy, values)


# ---- configs and --set -----------------------------------------------------------------

CONFIGS = [(FedNLConfig, "fednl/quick"), (FedNLExperimentConfig, "fednl/experiment-quick"),
           (SCoLExperimentConfig, "scol/quick"), (RefineExperimentConfig, None),
           (TransferConfig, "refine/transfer-quick"), (FuserTrainConfig, None),
           (WorldConfig, None), (TextPretrainConfig, None), (SweepConfig, None),
           (MQARConfig, None)]
LITERALS = ["[1, 2]", "{a = 1}", "1e400", "nan", "-inf", "'''x'''", '"x"', "1\nrounds = 2",
            "[[1]]", "true", "0", "-1", "2024-01-01", "[1, 'a']", "{}", "[]", "'", "9" * 5000]


@st.composite
def overrides(draw, cls):
    keys = [k for k, _, _ in field_docs(cls)]
    out = []
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.one_of(st.sampled_from(keys), st.sampled_from(keys).map(lambda k: k + ".x"),
                             st.sampled_from(keys).map(lambda k: k.split(".")[0]),
                             st.sampled_from(["", ".", "a..b", "train.lr.x"]),
                             st.text(max_size=8)))
        value = draw(st.one_of(st.sampled_from(LITERALS), st.text(max_size=12)))
        out.append(f"{key}={value}")
    return out


@FUZZ
@given(data=st.data())
@example(data=None)
def test_any_set_overrides_work_or_are_refused_cleanly(data):
    if data is None:   # a value over a table, then a key inside the value: seen to crash
        for sets in (["train.rounds=3", "train.rounds.x=1"], ["train=3", "train.lr=1"],
                     ["method=3", "method.window=1"]):
            assert clean(load_config, FedNLConfig, None, sets) is None
        assert clean(load_config, FedNLConfig, None, ["train.rounds.x=1"],
                     preset=preset_path("fednl", "quick")) is None
        assert clean(load_config, FedNLConfig, None, ["train.rounds=1\nrounds = 2"]) is None
        return
    cls, preset = data.draw(st.sampled_from(CONFIGS))
    args = argparse.Namespace(config=None, overrides=data.draw(overrides(cls)),
                              quick=bool(preset) and data.draw(st.booleans()), quick_preset=preset)
    clean(load_from_args, cls, args)   # what the commands do with --quick and --set


@st.composite
def config_trees(draw, cls):
    keys = [k for k, _, _ in field_docs(cls)] + ["nope", "method"]
    tree = {}
    for key in draw(st.lists(st.sampled_from(keys), max_size=4)):
        node = tree
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {}) if isinstance(node.get(p, {}), dict) else {}
        node[parts[-1]] = draw(values)
    return tree


@FUZZ
@given(data=st.data())
def test_any_config_file_works_or_is_refused_cleanly(scratch, data):
    cls, _ = data.draw(st.sampled_from(CONFIGS))
    suffix = data.draw(st.sampled_from([".json", ".yaml", ".toml"]))
    path = scratch / f"config{suffix}"
    if data.draw(st.booleans()):
        path.write_bytes(data.draw(raw))
    else:
        tree = data.draw(config_trees(cls))
        text = json.dumps(tree) if suffix != ".yaml" else yaml.safe_dump(tree)
        if suffix == ".toml":   # TOML-like lines over the same keys
            text = "\n".join(f"{k} = {json.dumps(v)}" for k, v in tree.items())
        path.write_text(text)
    clean(load_config, cls, path)


def test_yaml_keys_that_are_not_names_are_refused_cleanly(scratch):
    path = scratch / "keys.yaml"
    path.write_text("1: 2\nrounds: 3\nnull: 4\n")
    with pytest.raises(PlasticError, match="config 1: keys should be strings"):
        load_config(FedNLConfig, path)


# ---- the SCoL action parser ------------------------------------------------------------

@settings(max_examples=200, deadline=None, database=None)
@given(text=st.text(max_size=200), n=st.integers(1, 64))
@example(text="layers: " + "9" * 5000, n=8)
@example(text="-" + "1" * 4400, n=8)
def test_any_text_parses_to_valid_layers(text, n):
    action = parse_layers(text, n)
    assert list(action.layers) == sorted(set(action.layers))
    assert all(0 <= i < n for i in action.layers)


@settings(max_examples=200, deadline=None, database=None)
@given(before=st.text(max_size=30), layers=st.sets(st.integers(0, 31), min_size=1, max_size=5),
       after=st.text(alphabet=st.characters(exclude_categories=["Nd"]), max_size=20))
@example(before="İ", layers={3}, after="")
@example(before="İİ", layers={1, 2}, after="")
def test_an_action_after_any_text_parses_back(before, layers, after):
    if "layers:" in before.lower():
        return
    action = parse_layers(before + format_action(layers) + after, 32)
    assert action.layers == tuple(sorted(layers))


# ---- the llama2.c importer -------------------------------------------------------------

dims = st.one_of(st.integers(-3, 16), st.integers(-2**31, 2**31 - 1), st.just(HUGE))


@FUZZ
@given(header=st.tuples(*[dims] * 7), body=st.binary(max_size=256))
@example(header=(HUGE, HUGE, 1023, 1, 1, 9_999_999, 9_999_999), body=b"")
def test_any_llama2c_header_is_read_or_refused_cleanly(scratch, header, body):
    path = scratch / "model.bin"
    path.write_bytes(struct.pack("<7i", *header) + body)
    t0 = time.time()
    clean(load_llama2c_model, path)
    assert time.time() - t0 < BOUND_SECONDS + 3


def llama2c_floats(dim, hidden, layers, heads, kv, vocab, seq) -> int:
    """How many float32 a llama2.c v0 file of these sizes holds (its layout)."""
    hs = dim // heads
    n = abs(vocab) * dim + layers * (2 * dim + dim * heads * hs * 2 + 2 * dim * kv * hs
                                     + 3 * dim * hidden) + dim + seq * (hs // 2) * 2
    return n + (abs(vocab) * dim if vocab < 0 else 0)


@FUZZ
@given(dim=st.integers(1, 12), hidden=st.integers(1, 6), layers=st.integers(1, 2),
       heads=st.integers(1, 4), kv=st.integers(1, 4), vocab=st.integers(-6, 6),
       seq=st.integers(1, 4), fill=st.sampled_from([0.5, -1.0, math.nan]))
@example(dim=3, hidden=2, layers=1, heads=1, kv=1, vocab=4, seq=2, fill=0.5)  # odd head dim
def test_a_llama2c_file_of_any_sizes_loads_or_is_refused_cleanly(scratch, dim, hidden, layers,
                                                                heads, kv, vocab, seq, fill):
    path = scratch / "sized.bin"
    n = llama2c_floats(dim, hidden, layers, heads, kv, vocab, seq) if vocab and heads <= dim \
        else 0
    path.write_bytes(struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq)
                     + struct.pack(f"<{n}f", *[fill] * n))
    model = clean(load_llama2c_model, path)
    if model is not None:   # what loads also runs
        assert model(torch.tensor([[0]])).logits.shape == (1, 1, abs(vocab))


def tokenizer_file(tokens) -> bytes:
    out = struct.pack("<i", max((len(t) for _, t in tokens), default=1))
    for score, text in tokens:
        out += struct.pack("<fi", score, len(text)) + text
    return out


@FUZZ
@given(content=raw, vocab=st.integers(1, 12))
def test_any_llama2c_tokenizer_file_is_read_or_refused_cleanly(scratch, content, vocab):
    path = scratch / "tok.bin"
    path.write_bytes(content)
    clean(llama2c_tokenizer, path, vocab)


@FUZZ
@given(tokens=st.lists(st.tuples(st.floats(width=32), st.binary(min_size=1, max_size=5)),
                       min_size=1, max_size=12),
       text=st.text(max_size=30))
def test_any_well_formed_llama2c_vocabulary_gives_a_working_tokenizer(scratch, tokens, text):
    path = scratch / "vocab.bin"
    path.write_bytes(tokenizer_file(tokens))
    tok = llama2c_tokenizer(path, len(tokens))
    ids = tok(text)["input_ids"]
    assert all(0 <= i < len(tok) for i in ids)
    tok.decode(ids)


def test_a_repeated_llama2c_piece_keeps_ids_below_the_vocabulary_size(scratch):
    """Found by the fuzzing above: a piece repeated in the file left a hole in the ids, so
    the tokenizer's size fell below the vocabulary's and the last piece's id was past it."""
    path = scratch / "repeated.bin"
    path.write_bytes(tokenizer_file([(0.0, b"\x00")] * 5 + [(0.0, b"Y")]))
    tok = llama2c_tokenizer(path, 6)
    assert len(tok) == 6
    assert tok("Y")["input_ids"][-1] == 5


# ---- dataset loaders -------------------------------------------------------------------

text_ = st.text(max_size=20)
squad_answer = st.fixed_dictionaries({"text": maybe(text_), "answer_start": maybe(
    st.integers(-5, 30))})
squad_qa = st.fixed_dictionaries({"id": maybe(st.one_of(text_, st.integers())),
                                  "question": maybe(text_),
                                  "answers": maybe(st.lists(maybe(squad_answer), max_size=2))})
squad_doc = st.fixed_dictionaries({"data": maybe(st.lists(maybe(st.fixed_dictionaries({
    "title": maybe(text_), "paragraphs": maybe(st.lists(maybe(st.fixed_dictionaries({
        "context": maybe(text_), "qas": maybe(st.lists(maybe(squad_qa), max_size=2))})),
        max_size=2))})), max_size=2))})
LETTER = st.sampled_from(["A", "B", "C", "D", "E", "a", ""])
long_item = st.fixed_dictionaries({k: maybe(LETTER if k == "answer" else text_) for k in (
    "_id", "domain", "sub_domain", "difficulty", "length", "question", "choice_A", "choice_B",
    "choice_C", "choice_D", "answer", "context")})
niah_line = st.fixed_dictionaries({
    "id": maybe(text_), "task": maybe(st.sampled_from(["single", "uuid", "nope"])),
    "context": maybe(text_), "question": maybe(text_), "answers": maybe(st.lists(text_)),
    "length": maybe(st.integers(0, 99)), "depth": maybe(st.floats(0, 1)),
    "unit": maybe(st.sampled_from(["words", "tokens"])), "meta": maybe(st.dictionaries(
        text_, text_))})
stream_line = st.fixed_dictionaries({"id": maybe(text_), "kind": maybe(text_),
                                     "items": maybe(st.lists(values, max_size=3))})


def jsonl(objs) -> bytes:
    return "".join(json.dumps(o) + "\n" for o in objs).encode()


@FUZZ
@given(content=st.one_of(raw, squad_doc.map(lambda d: json.dumps(d).encode())))
def test_any_squad_file_loads_or_is_refused_cleanly(scratch, content):
    path = scratch / "squad.json"
    path.write_bytes(content)
    for passage in clean(load_squad, path) or []:
        for qa in passage.qas:   # what loads is what the loader promises
            assert all(passage.context[a.start:a.start + len(a.text)] == a.text and a.start >= 0
                       for a in qa.answers)


@FUZZ
@given(content=st.one_of(raw, st.lists(maybe(long_item), max_size=3)), lines=st.booleans())
def test_any_longbench_file_loads_or_is_refused_cleanly(scratch, content, lines):
    path = scratch / ("longbench.jsonl" if lines else "longbench.json")
    if isinstance(content, list):
        content = jsonl(content) if lines else json.dumps(content).encode()
    path.write_bytes(content)
    for item in clean(load_longbench, path) or []:
        assert item.answer in "ABCD" and all(isinstance(c, str) for c in item.choices)


@FUZZ
@given(content=st.one_of(raw, st.lists(maybe(niah_line), max_size=3).map(jsonl)))
def test_any_niah_file_loads_or_is_refused_cleanly(scratch, content):
    path = scratch / "niah.jsonl"
    path.write_bytes(content)
    for sample in clean(load_niah, path) or []:
        assert isinstance(sample.context, str) and all(isinstance(a, str) for a in sample.answers)
        assert sample.prompt.endswith("Answer:")


@FUZZ
@given(content=st.one_of(raw, st.lists(maybe(stream_line), max_size=3).map(jsonl)))
def test_any_streams_file_loads_or_is_refused_cleanly(scratch, content):
    path = scratch / "streams.jsonl"
    path.write_bytes(content)
    clean(load_streams, path)


def csv_bytes(rows) -> bytes:
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue().encode()


@FUZZ
@given(content=st.one_of(raw, st.lists(st.lists(text_, min_size=5, max_size=7).flatmap(
    lambda r: LETTER.map(lambda a: [*r[:5], a] if len(r) == 5 else r)), max_size=3).map(
    csv_bytes)))
def test_any_mmlu_csv_loads_or_is_refused_cleanly(scratch, content):
    folder = scratch / "mmlu"
    (folder / "test").mkdir(parents=True, exist_ok=True)
    (folder / "test" / "anatomy_test.csv").write_bytes(content)
    clean(load_mmlu, folder, "test")


@FUZZ
@given(content=raw)
def test_any_text_corpus_and_haystack_load_or_are_refused_cleanly(scratch, content):
    path = scratch / "corpus.txt"
    path.write_bytes(content)
    clean(load_text_corpus, path)
    folder = scratch / "hay"
    folder.mkdir(exist_ok=True)
    shutil.copy(path, folder / "essay.txt")
    clean(load_haystack, folder)


# ---- fuser, memory adapter and theta folders -------------------------------------------

FUSER_SIZES = dict(receiver_layers=2, receiver_kv_heads=1, receiver_head_dim=8,
                   transmitter_layers=2, transmitter_kv_heads=1, transmitter_head_dim=8)
size_values = st.one_of(st.integers(-2, 4), st.just(HUGE), st.just(2**62), values)


@pytest.fixture(scope="module")
def fuser_folder(scratch):
    fusers = {}
    for kind in ("c2c", "lowrank"):
        fuser = Fuser(FuserConfig(**FUSER_SIZES, kind=kind, rank=2, hidden=4),
                      torch.ones(4), torch.ones(4))
        fusers[kind] = fuser.save_pretrained(scratch / f"fuser-{kind}")
    return fusers


@FUZZ
@given(kind=st.sampled_from(["c2c", "lowrank"]),
       changes=st.dictionaries(st.sampled_from([*FUSER_SIZES, "kind", "rank", "hidden",
                                                "dropout", "layer_map", "mode", "share",
                                                "draft_tokens", "fuse_last", "nope"]),
                               size_values, max_size=3),
       drop=st.lists(st.sampled_from(list(FUSER_SIZES)), max_size=1))
@example(kind="c2c", changes={"receiver_layers": HUGE}, drop=[])
@example(kind="lowrank", changes={"transmitter_kv_heads": HUGE, "rank": HUGE}, drop=[])
@example(kind="c2c", changes={"receiver_head_dim": "8"}, drop=[])
@example(kind="c2c", changes={"receiver_kv_heads": 2**62}, drop=[])
def test_any_fuser_config_loads_or_is_refused_cleanly(fuser_folder, scratch, kind, changes,
                                                      drop):
    folder = scratch / "fuser-fuzzed"
    shutil.copytree(fuser_folder[kind], folder, dirs_exist_ok=True)
    config = json.loads((fuser_folder[kind] / "fuser_config.json").read_text())
    config.update(changes)
    for key in drop:
        config.pop(key, None)
    (folder / "fuser_config.json").write_text(json.dumps(config))
    t0 = time.time()
    fuser = clean(Fuser.from_pretrained, folder)
    assert time.time() - t0 < BOUND_SECONDS
    if fuser is not None:
        assert fuser.config.layers   # the layer map of what loads is usable


@FUZZ
@given(content=raw)
def test_any_fuser_config_bytes_are_read_or_refused_cleanly(fuser_folder, scratch, content):
    folder = scratch / "fuser-bytes"
    shutil.copytree(fuser_folder["c2c"], folder, dirs_exist_ok=True)
    (folder / "fuser_config.json").write_bytes(content)
    clean(Fuser.from_pretrained, folder)


@pytest.fixture(scope="module")
def memory_folder(scratch):
    base = build_tiny("qwen3", vocab_size=32, hidden_size=16, num_layers=2, num_heads=2)
    model = attach_memory(copy.deepcopy(base), layers=[1], window=8, rank=2, conv_size=2)
    save_pretrained(model, scratch / "memory")
    return base, scratch / "memory"


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(["layers", "window", "rank", "lora_alpha",
                                                "conv_size", "chunk_size", "mix", "gate",
                                                "decay", "lora_scope", "model_type", "nope"]),
                               st.one_of(size_values, st.lists(st.integers(-2, 3))), max_size=3))
@example(changes={"rank": HUGE})
@example(changes={"conv_size": HUGE})
@example(changes={"layers": list(range(10**5))})
def test_any_memory_adapter_config_loads_or_is_refused_cleanly(memory_folder, scratch, changes):
    base, good = memory_folder
    folder = scratch / "memory-fuzzed"
    shutil.copytree(good, folder, dirs_exist_ok=True)
    config = json.loads((good / "memory_config.json").read_text())
    config.update(changes)
    (folder / "memory_config.json").write_text(json.dumps(config))
    model = copy.deepcopy(base)
    t0 = time.time()
    loaded = clean(from_pretrained, model, folder)
    assert time.time() - t0 < BOUND_SECONDS
    if loaded is None:   # a refused adapter leaves the base model as it was
        assert memory_config(model) is None
    else:
        loaded(torch.tensor([[1, 2, 3]]))


@FUZZ
@given(content=raw)
def test_any_memory_adapter_config_bytes_are_read_or_refused_cleanly(memory_folder, scratch,
                                                                     content):
    base, good = memory_folder
    folder = scratch / "memory-bytes"
    shutil.copytree(good, folder, dirs_exist_ok=True)
    (folder / "memory_config.json").write_bytes(content)
    clean(from_pretrained, copy.deepcopy(base), folder)


@pytest.fixture(scope="module")
def theta_bytes(scratch):
    path = scratch / "theta.safetensors"
    save_file({"layers.0.gate_logit": torch.zeros(2), "layers.0.lora_q.A": torch.ones(2, 4)},
              str(path))
    return path.read_bytes()


@FUZZ
@given(data=st.data())
def test_any_damage_to_a_theta_file_is_read_or_refused_cleanly(scratch, theta_bytes, data):
    good = bytearray(theta_bytes)
    how = data.draw(st.sampled_from(["truncate", "flip", "header", "length"]))
    if how == "truncate":
        bad = bytes(good[:data.draw(st.integers(0, len(good)))])
    elif how == "flip":
        for at in data.draw(st.lists(st.integers(0, len(good) - 1), min_size=1, max_size=4)):
            good[at] = data.draw(st.integers(0, 255))
        bad = bytes(good)
    elif how == "header":   # a header of any JSON, its length right
        header = json.dumps(data.draw(st.one_of(values, st.fixed_dictionaries({"w": maybe(
            st.fixed_dictionaries({"dtype": maybe(st.sampled_from(["F32", "I64", "X"])),
                                   "shape": maybe(st.lists(st.integers(-1, 2**40), max_size=3)),
                                   "data_offsets": maybe(st.lists(st.integers(-1, 2**40),
                                                                  max_size=3))}))})))).encode()
        bad = struct.pack("<Q", len(header)) + header + bytes(good[-32:])
    else:
        bad = struct.pack("<Q", data.draw(st.integers(0, 2**64 - 1))) + bytes(good[8:])
    path = scratch / "damaged.safetensors"
    path.write_bytes(bad)
    clean(load_tensors, path, "theta")


@FUZZ
@given(pointer=st.one_of(raw, values.map(lambda v: json.dumps({"round": v}).encode())),
       lines=st.lists(st.one_of(values, st.fixed_dictionaries({"round": maybe(
           st.integers(-1, 3))})), max_size=3))
@example(pointer=b'{"round": 1}', lines=[5, {"round": 1}])
def test_any_fednl_run_folder_resumes_or_is_refused_cleanly(scratch, theta_bytes, pointer,
                                                           lines):
    run = scratch / "run"
    shutil.rmtree(run, ignore_errors=True)
    (run / "round_0001").mkdir(parents=True)
    (run / "round_0001" / "theta.safetensors").write_bytes(theta_bytes)
    (run / "checkpoint.json").write_bytes(pointer)
    (run / "metrics.jsonl").write_bytes(jsonl(lines))
    result = clean(Checkpointer(run, FedNLConfig()).latest, {"w": torch.zeros(1)})
    if result is not None:
        assert result[0] >= 0
