"""Pre-trained sandbox models: a tokenizer pair and a small heterogeneous model family.

Lives in ``data`` because it needs both the world (``plasticlm.data``) and the model
builders (``plasticlm.models``); ``models`` must not import ``data``. Evaluation uses
``plasticlm.eval`` (same layer, no import back into ``data``).

The ``sandbox`` preset trains, on one world (seed 0): a Qwen3 receiver, a Llama and a
Qwen2 transmitter of other sizes, and a Llama specialist that mostly reads one domain's
private facts; two BPE tokenizers (1,024 and 768 tokens, trained on different text) make
cross-vocabulary paths real. Folders: ``cache_home()/models/sandbox/<name>``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from plasticlm.data.corpus import load_text_corpus
from plasticlm.data.mmlu import load_mmlu
from plasticlm.data.niah import generate_niah, haystack_sentences, score
from plasticlm.data.world import (
    WorldConfig,
    generate_world,
    mc_prompt,
    question_meta,
    read_world_index,
    write_world,
)
from plasticlm.errors import PlasticError


@dataclass
class TokenizerSpec:
    name: str
    vocab_size: int
    corpus: str = "train"            # train | mixed (valid + specialist + half of train)


@dataclass
class ModelSpec:
    """One model of the family: architecture, sizes, tokenizer, training budget."""

    name: str
    arch: str
    tokenizer: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    steps: int
    corpus: str = "train"            # train | specialist (specialist docs + some general)
    batch_size: int = 8
    lr: float = 2e-3
    seed: int = 0
    # Steps of fresh single-needle NIAH drills after pre-training. The corpus's fixed drills
    # are memorised rather than teaching the copy; see train_niah_drills.
    drill_steps: int = 0


@dataclass
class Preset:
    name: str
    world: WorldConfig
    tokenizers: list[TokenizerSpec]
    models: list[ModelSpec]
    seq_len: int = 256
    specialist_general_fraction: float = 0.3  # general docs per specialist doc
    # (task, length in tokens) probes of the receiver, inside its training length.
    niah: tuple[tuple[str, int], ...] = (("single", 128), ("single", 224), ("multikey", 224))
    niah_samples: int = 20
    drill_lengths: tuple[int, ...] = (64, 96, 128)   # tokens; probes go beyond them
    drill_batch_size: int = 16
    drill_lr: float = 1e-3


PRESETS: dict[str, Preset] = {
    "sandbox": Preset(
        "sandbox", WorldConfig(seed=0),
        [TokenizerSpec("bpe1024", 1024, "train"), TokenizerSpec("bpe768", 768, "mixed")],
        [ModelSpec("receiver", "qwen3", "bpe1024", 256, 4, 4, 2, 64, 768, steps=450,
                   drill_steps=400),
         ModelSpec("transmitter-llama", "llama", "bpe768", 192, 4, 4, 4, 48, 512, steps=250,
                   seed=1),
         ModelSpec("transmitter-qwen2", "qwen2", "bpe1024", 128, 3, 4, 2, 32, 384, steps=250,
                   seed=2),
         ModelSpec("specialist", "llama", "bpe768", 160, 3, 4, 2, 40, 480, steps=250,
                   corpus="specialist", seed=3)]),
    "quick": Preset(
        "quick",
        WorldConfig(seed=0, core_per_domain=8, unseen_per_domain=2, specialist_entities=8,
                    max_mentions=3, drills=6, longbench_per_length=1,
                    longbench_words=(120, 200, 300), streams=1, stream_length=3),
        [TokenizerSpec("bpe320", 320, "train"), TokenizerSpec("bpe300", 300, "mixed")],
        [ModelSpec("receiver", "qwen3", "bpe320", 32, 2, 2, 1, 16, 64, steps=3, batch_size=4,
                   drill_steps=2),
         ModelSpec("transmitter-llama", "llama", "bpe300", 32, 2, 2, 2, 16, 64, steps=2,
                   batch_size=4),
         ModelSpec("specialist", "llama", "bpe300", 32, 1, 2, 2, 16, 64, steps=2,
                   batch_size=4, corpus="specialist")],
        seq_len=64, niah=(("single", 160),), niah_samples=2, drill_lengths=(48,),
        drill_batch_size=2),
}


def preset_dir(preset: str = "sandbox") -> Path:
    from plasticlm.runs import cache_home

    return cache_home() / "models" / ("sandbox" if preset == "sandbox" else f"sandbox-{preset}")


def _preset(name: str) -> Preset:
    if name not in PRESETS:
        raise PlasticError(f"unknown pretrain preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def _save_atomic(model, tokenizer, out: Path) -> None:
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def _build(spec: ModelSpec, vocab_size: int, max_len: int):
    from plasticlm.models import build_tiny

    return build_tiny(spec.arch, seed=spec.seed, vocab_size=vocab_size,
                      hidden_size=spec.hidden_size, num_layers=spec.num_layers,
                      num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                      head_dim=spec.head_dim, intermediate_size=spec.intermediate_size,
                      max_position_embeddings=max_len)


@torch.no_grad()
def mc_accuracy(model, tokenizer, questions, batch_size: int = 32) -> list[bool]:
    """Per question: is the right choice the most likely continuation of its prompt?

    Each choice is scored as `` <choice>`` after :func:`world.mc_prompt` by total log-prob
    (``plasticlm.eval.score_continuations``); chance is 25%.
    """
    from plasticlm.eval import encode_pair, pad_id_of, score_continuations

    ctxs, conts = [], []
    for q in questions:
        for c in q.choices:
            a, b = encode_pair(tokenizer, mc_prompt(q.question), " " + c)
            ctxs.append(a)
            conts.append(b)
    scores = score_continuations(model, ctxs, conts, pad_id=pad_id_of(tokenizer),
                                 batch_size=batch_size)
    out = []
    for i, q in enumerate(questions):
        s = [x.logprob for x in scores[4 * i: 4 * i + 4]]
        out.append(max(range(4), key=s.__getitem__) == q.answer_index)
    return out


def _split_table(correct: list[bool], keys: list[dict]) -> dict:
    """Accuracy overall, per domain, per bucket and per domain x bucket."""
    groups: dict[str, list[bool]] = defaultdict(list)
    for ok, k in zip(correct, keys):
        groups["all"].append(ok)
        groups[f"domain/{k['subject']}"].append(ok)
        groups[f"bucket/{k['bucket']}"].append(ok)
        groups[f"domain_bucket/{k['subject']}/{k['bucket']}"].append(ok)
    return {g: {"accuracy": round(sum(v) / len(v), 4), "n": len(v)}
            for g, v in sorted(groups.items())}


def evaluate_world_mc(model, tokenizer, world_dir: Path, role: str = "core",
                      splits: tuple[str, ...] = ("val", "test")) -> dict:
    """MC accuracy on a world's questions of ``role``, split by domain and head/torso/tail."""
    folder = world_dir / ("mmlu" if role == "core" else "specialist_mmlu")
    meta = question_meta(read_world_index(world_dir), role)
    qs = [q for s in splits for q in load_mmlu(folder, s)]
    correct = mc_accuracy(model, tokenizer, qs)
    return _split_table(correct, [meta[(q.subject, q.split, q.index)] for q in qs])


def _same_format(value: str, rng: random.Random) -> str:
    """A random string shaped like ``value``: digits stay digits, hex letters hex letters."""
    out = []
    for ch in value:
        if ch.isdigit():
            out.append(rng.choice("0123456789"))
        elif ch in "abcdef":
            out.append(rng.choice("abcdef0123456789"))
        else:
            out.append(ch)
    return "".join(out)


def niah_choice(model, tokenizer, samples, num_choices: int = 4, seed: int = 0) -> float:
    """Retrieval by choice: the needle's first answer against ``num_choices - 1`` random
    strings of the same format, scored by the model's log-likelihood after the prompt.
    Chance is 1/num_choices; it shows whether the model reads the needle at all even when it
    cannot copy it token for token."""
    from plasticlm.eval import encode_pair, pad_id_of, score_continuations

    rng = random.Random(seed)
    contexts, conts = [], []
    for s in samples:
        true = s.answers[0]
        options = [true]
        while len(options) < num_choices:
            fake = _same_format(true, rng)
            if fake not in options:
                options.append(fake)
        for o in options:
            ctx, cont = encode_pair(tokenizer, s.prompt, " " + o)
            contexts.append(ctx)
            conts.append(cont)
    scored = score_continuations(model, contexts, conts, pad_id_of(tokenizer), 16, "right")
    hits = 0
    for i in range(len(samples)):
        group = [x.logprob for x in scored[i * num_choices:(i + 1) * num_choices]]
        hits += max(range(num_choices), key=group.__getitem__) == 0
    return hits / len(samples)


def evaluate_niah(model, tokenizer, sentences: list[str], probes, n: int, seed: int = 0) -> dict:
    """Per ``(task, length in tokens)`` probe: the mean task score of greedy answers
    (``score``, RULER's measure) and retrieval by 4-way choice (``choice``, chance 0.25)."""
    from plasticlm.eval import generate_texts

    out = {}
    for task, length in probes:
        samples = generate_niah(task, n, length, sentences, seed=seed, tokenizer=tokenizer)
        preds = generate_texts(model, tokenizer, [s.prompt for s in samples],
                               max_new_tokens=12, stop=("\n",))
        out[f"{task}/{length}"] = {
            "score": round(sum(score(s, p) for s, p in zip(samples, preds)) / n, 4), "n": n,
            "choice": round(niah_choice(model, tokenizer, samples, seed=seed), 4),
            "mean_length": round(sum(s.length for s in samples) / n, 1),
            "example": {"answers": samples[0].answers, "prediction": preds[0]}}
    return out


def niah_drill_batch(tokenizer, sentences: list[str], batch_size: int, length: int,
                     seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, labels)``, both ``[batch_size, T]``, of fresh single-needle samples of
    about ``length`` tokens; labels are -100 except on the answer (right-padded)."""
    from plasticlm.eval import encode_pair

    pairs = [encode_pair(tokenizer, s.prompt, s.target)
             for s in generate_niah("single", batch_size, length, sentences, seed=seed)]
    width = max(len(c) + len(a) for c, a in pairs)
    ids = torch.full((batch_size, width), tokenizer.pad_token_id or 0, dtype=torch.long)
    labels = torch.full((batch_size, width), -100, dtype=torch.long)
    for i, (c, a) in enumerate(pairs):
        ids[i, : len(c) + len(a)] = torch.tensor(c + a)
        labels[i, len(c): len(c) + len(a)] = torch.tensor(a)
    return ids, labels


def train_niah_drills(model, tokenizer, sentences: list[str], steps: int,
                      lengths: tuple[int, ...] = (64, 96, 128), batch_size: int = 16,
                      lr: float = 1e-3, seed: int = 0, replay: bool = True,
                      progress: bool = True) -> list[float]:
    """Fine-tune ``model`` on ``steps`` batches of never-repeated single-needle drills whose
    haystack is ``sentences``. Each step's loss is the answer's cross-entropy plus, with
    ``replay``, that of the haystack text: with the world's own sentences as haystack, the
    second term replays the corpus, so the model learns to copy without forgetting the world
    (answer loss alone took its held-out MC accuracy from 52% to 31%). Returns the losses."""
    import torch.nn.functional as F

    from plasticlm.models import train_steps

    rng = random.Random(seed)
    pad = tokenizer.pad_token_id or 0

    def loss_at(step: int) -> torch.Tensor:
        # Seeds far from the evaluation's (0..) so no drill repeats an evaluated needle.
        ids, answer = niah_drill_batch(tokenizer, sentences, batch_size, rng.choice(lengths),
                                       seed=1_000_000 + 10_007 * seed + step)
        text = ids.masked_fill((answer != -100) | (ids == pad), -100)
        logits = model(input_ids=ids).logits[:, :-1].flatten(0, 1).float()
        loss = F.cross_entropy(logits, answer[:, 1:].flatten(), ignore_index=-100)
        if replay:
            loss = loss + F.cross_entropy(logits, text[:, 1:].flatten(), ignore_index=-100)
        return loss

    return train_steps(model, loss_at, steps, lr=lr, warmup=min(20, steps // 5 + 1),
                       desc="NIAH drills", progress=progress)


def _blocks(tokenizer, docs: list[str], seq_len: int) -> torch.Tensor:
    from plasticlm.models import pack_corpus

    return pack_corpus(tokenizer, docs, seq_len)


def _loss_report(model, tokenizer, train_docs, valid_docs, seq_len: int) -> dict:
    from plasticlm.models import evaluate_loss, unigram_loss

    train = _blocks(tokenizer, train_docs, seq_len)
    valid = _blocks(tokenizer, valid_docs, min(seq_len, 64))
    return {"valid_loss": round(evaluate_loss(model, valid), 4),
            "unigram_loss": round(unigram_loss(train, valid, len(tokenizer)), 4),
            "train_tokens": int(train[:, 1:].numel())}


def pretrain_preset(preset: str = "sandbox", out: str | Path | None = None,
                    progress: bool = True, reuse: bool = True) -> dict:
    """Write the world, train tokenizers and every model of ``preset``, evaluate, save.

    With ``reuse``, a model folder whose ``pretrain_info.json`` names the same spec is
    loaded instead of retrained (an interrupted preset resumes). Returns the report (also
    written to ``<out>/report.json``).
    """
    from plasticlm.models import describe, load_causal_lm, train_bpe_tokenizer, train_lm
    from plasticlm.runs import seed_everything

    p = _preset(preset)
    out = Path(out) if out else preset_dir(preset)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    world = generate_world(p.world)
    world_dir = write_world(world, out / "world")
    rng = random.Random(p.world.seed)
    texts = {"train": world.train_docs,
             "mixed": world.valid_docs + world.specialist_docs
             + rng.sample(world.train_docs, len(world.train_docs) // 2)}
    toks = {}
    for ts in p.tokenizers:
        toks[ts.name] = train_bpe_tokenizer(texts[ts.corpus], vocab_size=ts.vocab_size)
        toks[ts.name].save_pretrained(out / "tokenizers" / ts.name)
    n_general = int(p.specialist_general_fraction * len(world.specialist_docs))
    corpora = {"train": world.train_docs,
               "specialist": world.specialist_docs + rng.sample(world.train_docs, n_general)}
    niah_hay = haystack_sentences(world.valid_docs)
    drill_hay = haystack_sentences(world.train_docs)
    # The machine's load is part of any timing: other jobs slow a 2-core run several-fold.
    report: dict = {"preset": preset, "world": asdict(p.world), "seq_len": p.seq_len,
                    "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                    "loadavg_start": [round(x, 2) for x in os.getloadavg()], "models": {}}
    for spec in p.models:
        t = time.time()
        seed_everything(spec.seed)
        tok = toks[spec.tokenizer]
        folder = out / spec.name
        info_path = folder / "pretrain_info.json"
        info = json.loads(info_path.read_text()) if reuse and info_path.exists() else None
        if info is not None and info["spec"] == asdict(spec):
            model, tok = load_causal_lm(folder)
        else:
            blocks = _blocks(tok, corpora[spec.corpus], p.seq_len)
            model = _build(spec, len(tok), max(2048, 4 * p.seq_len))
            losses = train_lm(model, blocks, spec.steps, batch_size=spec.batch_size, lr=spec.lr,
                              warmup=min(50, spec.steps // 5 + 1), seed=spec.seed,
                              desc=f"pre-train {spec.name}", progress=progress)
            info = {"spec": asdict(spec), "train_seconds": round(time.time() - t, 1),
                    "first_loss": round(losses[0], 4),
                    "last_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4),
                    "loss_every_10": [round(x, 4) for x in losses[::10]]}
            if spec.drill_steps:
                # Measured before and after, so the report shows what the drills add.
                info["before_drills"] = {
                    "niah": evaluate_niah(model, tok, niah_hay, p.niah, p.niah_samples),
                    "mc_core_heldout": evaluate_world_mc(model, tok, world_dir, "core")["all"]}
                t_drill = time.time()
                drill = train_niah_drills(model, tok, drill_hay, spec.drill_steps,
                                          p.drill_lengths, p.drill_batch_size, p.drill_lr,
                                          seed=spec.seed, progress=progress)
                info["drill_seconds"] = round(time.time() - t_drill, 1)
                info["drill_loss_every_10"] = [round(x, 4) for x in drill[::10]]
                info["train_seconds"] = round(time.time() - t, 1)
            _save_atomic(model, tok, folder)
            info_path.write_text(json.dumps(info, indent=1) + "\n")
        t_eval = time.time()
        entry = {**info, "describe": describe(model), "tokenizer": spec.tokenizer,
                 **_loss_report(model, tok, corpora[spec.corpus], world.valid_docs, p.seq_len),
                 "mc_core_heldout": evaluate_world_mc(model, tok, world_dir, "core"),
                 "mc_specialist_heldout": evaluate_world_mc(model, tok, world_dir,
                                                            "specialist")}
        if spec.name == "receiver":
            entry["mc_core_dev"] = evaluate_world_mc(model, tok, world_dir, "core", ("dev",))
            entry["niah"] = evaluate_niah(model, tok, niah_hay, p.niah, p.niah_samples)
        entry["eval_seconds"] = round(time.time() - t_eval, 1)
        report["models"][spec.name] = entry
    report["total_seconds"] = round(time.time() - t0, 1)
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["niah_chance"] = {"single": 1e-5, "multikey": 0.25,
                             "note": "single: a 5-digit number guessed blind; multikey: "
                                     "copying one of the 4 needles' numbers at random"}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def ensure_sandbox_models(preset: str = "sandbox", progress: bool = True) -> dict[str, Path]:
    """Paths of the preset's model folders, training the whole preset when any is missing."""
    p = _preset(preset)
    root = preset_dir(preset)
    paths = {m.name: root / m.name for m in p.models}
    if not all((q / "config.json").exists() for q in paths.values()) or \
            not (root / "report.json").exists():
        pretrain_preset(preset, root, progress=progress)
    return paths


def sandbox_model(name: str, preset: str = "sandbox", progress: bool = True) -> Path:
    """The HF folder of one sandbox model (trained on first use); load with load_causal_lm."""
    names = [m.name for m in _preset(preset).models]
    if name not in names:
        raise PlasticError(f"no sandbox model {name!r} in preset {preset!r}; choose one of "
                           f"{', '.join(names)}")
    return ensure_sandbox_models(preset, progress)[name]


def sandbox_preset_of(spec: str) -> str | None:
    """The preset a spec names: ``"sandbox"`` and ``"quick"`` as themselves,
    ``"sandbox-quick"`` as ``"quick"``; None for anything else (a path, a hub id)."""
    if spec in PRESETS:
        return spec
    if spec.startswith("sandbox-") and spec[len("sandbox-"):] in PRESETS:
        return spec[len("sandbox-"):]
    return None


def resolve_model_spec(spec: str) -> str:
    """``<preset>:<name>`` (``sandbox:receiver``, ``quick:specialist``,
    ``sandbox-quick:receiver``) -> the pre-trained sandbox folder, trained when missing;
    any other spec (a local folder or a hub id) unchanged."""
    head, _, name = spec.partition(":")
    preset = sandbox_preset_of(head) if name else None
    return str(sandbox_model(name, preset=preset)) if preset else spec


def resolve_data_spec(spec: str) -> Path:
    """A preset name (``sandbox``, ``quick``, ``sandbox-quick``) -> its world folder; any
    other spec -> that folder."""
    preset = sandbox_preset_of(spec)
    return Path(sandbox_world(preset)) if preset else Path(spec)


def sandbox_world(preset: str = "sandbox", progress: bool = True) -> Path:
    """The world folder the preset's models were trained on."""
    ensure_sandbox_models(preset, progress)
    return preset_dir(preset) / "world"


@dataclass
class TextPretrainConfig:
    """``plasticlm models pretrain --text FILE``: one model on any plain-text corpus."""

    arch: str = "qwen3"
    vocab_size: int = 1024
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768
    steps: int = 300
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    seed: int = 0
    max_docs: int | None = None
    valid_fraction: float = 0.05


def pretrain_text(text: str | Path, out: str | Path, cfg: TextPretrainConfig | None = None,
                  progress: bool = True) -> dict:
    """Train a BPE tokenizer and a model on a text corpus; save an HF folder with a report."""
    from plasticlm.models import describe, train_bpe_tokenizer, train_lm
    from plasticlm.runs import seed_everything

    cfg = cfg or TextPretrainConfig()
    docs = [d.text for d in load_text_corpus(text, cfg.max_docs)]
    if len(docs) < 2:
        raise PlasticError(f"{text}: need at least 2 documents (separated by <|endoftext|>) to "
                           "hold one out for validation")
    rng = random.Random(cfg.seed)
    rng.shuffle(docs)
    n_valid = max(1, int(cfg.valid_fraction * len(docs)))
    valid, train = docs[:n_valid], docs[n_valid:]
    seed_everything(cfg.seed)
    t = time.time()
    tok = train_bpe_tokenizer(train, vocab_size=cfg.vocab_size)
    spec = ModelSpec("text", cfg.arch, "own", cfg.hidden_size, cfg.num_layers, cfg.num_heads,
                     cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.steps,
                     batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed)
    blocks = _blocks(tok, train, cfg.seq_len)
    model = _build(spec, len(tok), max(2048, 4 * cfg.seq_len))
    losses = train_lm(model, blocks, cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr,
                      warmup=min(50, cfg.steps // 5 + 1), seed=cfg.seed, progress=progress)
    out = Path(out)
    _save_atomic(model, tok, out)
    report = {"text": str(text), "config": asdict(cfg), "describe": describe(model),
              "train_seconds": round(time.time() - t, 1), "first_loss": round(losses[0], 4),
              "last_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4),
              **_loss_report(model, tok, train, valid, cfg.seq_len)}
    (out / "pretrain_report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


