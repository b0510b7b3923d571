"""Pre-train a sandbox preset: write its world, train its tokenizers and models, probe them.

Resumable: each model's pre-training and drills checkpoint every ``checkpoint_every`` steps
(:func:`plasticlm.models.train_steps`), finished models are kept, and a re-run continues
where a killed one stopped. CPU seconds are reported beside wall seconds, since another job
on the same cores slows a run several-fold.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from plasticlm.cpu import FLOAT_PATH
from plasticlm.data.niah import haystack_sentences
from plasticlm.errors import PlasticError
from plasticlm.models import describe, pack_corpus, train_bpe_tokenizer, train_lm
from plasticlm.models.pretrain import train_lm_segments
from plasticlm.runtime import machine, seed_everything
from plasticlm.sandbox.drills import train_drills
from plasticlm.sandbox.member import (  # noqa: F401  (save_model_atomic, build_model: used by others)
    build_model,
    cpu_seconds,
    load_member,
    loss_report,
    save_model_atomic,
    write_json_atomic,
)
from plasticlm.sandbox.presets import ModelSpec, Preset, get_preset, preset_dir
from plasticlm.sandbox.probes import (
    evaluate_niah,
    evaluate_openbook,
    evaluate_world_mc,
    probe_table,
)
from plasticlm.sandbox.reading import document_drawer
from plasticlm.sandbox.reading_probes import evaluate_reading, reading_table
from plasticlm.sandbox.shipped import (
    forget_shipped,
    install_shipped,
    read_manifest,
    shipped_keys,
    verify_installed,
)
from plasticlm.sandbox.tasks import write_world_tasks
from plasticlm.sandbox.world import World, generate_world
from plasticlm.sandbox.world_index import write_world

log = logging.getLogger("plasticlm.sandbox")


def member_key(p: Preset, spec: ModelSpec) -> str:
    """Everything a trained member depends on: its spec, its parent's key, the world, its
    tokenizer, the sequence length and the drill settings. A saved model or checkpoint is
    reused only under the same key."""
    parent = next((m for m in p.models if m.name == spec.init_from), None)
    drills = ((p.drill_lengths, p.drill_batch_size, p.drill_lr, p.drill_reading_share,
               p.drill_reading_filler) if spec.drill_steps else None)
    fields = asdict(spec)
    extra = {}
    if spec.reading_share:
        extra["reading"] = asdict(p.reading)
        if p.reading.world_weight == 1.0:
            del extra["reading"]["world_weight"]   # keys from before the field stay valid
    else:
        del fields["reading_share"]   # v2's keys (and its shipped family) stay as they were
    return json.dumps({"spec": fields, "world": asdict(p.world), "seq_len": p.seq_len,
                       "tokenizer": asdict(next(t for t in p.tokenizers
                                                if t.name == spec.tokenizer)),
                       "general_fraction": p.specialist_general_fraction, "drills": drills,
                       "parent": member_key(p, parent) if parent else None, **extra},
                      sort_keys=True)


def _openbook(p: Preset, model, tok, world: World) -> dict:
    return evaluate_openbook(model, tok, world, p.openbook_filler, p.openbook_samples)


def _train_member(p: Preset, spec: ModelSpec, tok, corpus: list[str], folder: Path,
                  world: World, world_dir: Path, drill_hay: list[str], niah_hay: list[str],
                  progress: bool) -> dict:
    """Pre-train (and drill) one model with checkpoints under ``folder.ckpt``; returns its
    training record."""
    t, c = time.time(), cpu_seconds()
    seed_everything(spec.seed)
    ckpt = folder.with_name(folder.name + ".ckpt")
    key = member_key(p, spec)
    stage1 = ckpt / "pretrained"
    stage1_info = ckpt / "pretrained.json"
    if stage1_info.exists() and json.loads(stage1_info.read_text()).get("key") == key:
        model, _ = load_member(stage1)
        info = json.loads(stage1_info.read_text())["info"]
    else:
        if spec.init_from:
            model, _ = load_member(folder.with_name(spec.init_from))
        else:
            model = build_model(spec, len(tok), max(2048, 4 * p.seq_len))
        run = dict(batch_size=spec.batch_size, lr=spec.lr, warmup=min(50, spec.steps // 5 + 1),
                   seed=spec.seed, desc=f"pre-train {spec.name}", progress=progress,
                   checkpoint=ckpt / "train", checkpoint_every=p.checkpoint_every,
                   checkpoint_key=key)
        if spec.reading_share:
            # a member that continues a reading model skips the curriculum's first phases
            mix = replace(p.reading, share=spec.reading_share,
                          **({"warmup_steps": 0, "ramp_steps": 0} if spec.init_from else {}))
            draw = document_drawer(world, mix, drill_hay, tok, corpus)
            losses = train_lm_segments(model, tok, draw, spec.steps, p.seq_len, **run)
        else:
            losses = train_lm(model, pack_corpus(tok, corpus, p.seq_len), spec.steps, **run)
        info = {"spec": asdict(spec), "key": key, "first_loss": round(losses[0], 4),
                "last_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4),
                "loss_every_10": [round(x, 4) for x in losses[::10]],
                "pretrain_seconds": round(time.time() - t, 1)}
        if spec.drill_steps:
            # Measured before the drills, so the report shows what they add.
            info["before_drills"] = {
                "niah": evaluate_niah(model, tok, niah_hay, p.niah, p.niah_samples),
                "mc_core_heldout": evaluate_world_mc(model, tok, world_dir, "core")["all"]}
            save_model_atomic(model, tok, stage1)
            write_json_atomic(stage1_info, {"key": key, "info": info})
    if spec.drill_steps:
        t_drill = time.time()
        drill = train_drills(model, tok, drill_hay, spec.drill_steps, p.drill_lengths,
                             p.drill_batch_size, p.drill_lr, seed=spec.seed, world=world,
                             reading_share=p.drill_reading_share,
                             reading_filler=p.drill_reading_filler,
                             progress=progress, checkpoint=ckpt / "drills",
                             checkpoint_every=p.checkpoint_every, checkpoint_key=key)
        info["drill_seconds"] = round(time.time() - t_drill, 1)
        info["drill_loss_every_10"] = [round(x, 4) for x in drill[::10]]
    info["train_seconds"] = round(time.time() - t, 1)
    info["train_cpu_seconds"] = round(cpu_seconds() - c, 1)
    save_model_atomic(model, tok, folder)
    write_json_atomic(folder / "pretrain_info.json", info)
    shutil.rmtree(ckpt, ignore_errors=True)
    return info


def pretrain_preset(preset: str = "sandbox", out: str | Path | None = None,
                    progress: bool = True, reuse: bool = True) -> dict:
    """Write the world, train tokenizers and every model of ``preset``, probe, save.

    With ``reuse``, a model folder whose ``pretrain_info.json`` names the same spec is kept,
    and an interrupted model resumes from its checkpoint. Returns the report (also written
    to ``<out>/report.json``, with the probe table in ``<out>/probes.md``).
    """
    p = get_preset(preset)
    out = Path(out) if out else preset_dir(preset)
    out.mkdir(parents=True, exist_ok=True)
    if read_manifest(out) is not None:
        # the shipped family installed here: pre-training rebuilds it, keeping none of it
        forget_shipped(out)
        reuse = False
    t0, c0 = time.time(), cpu_seconds()
    world = generate_world(p.world)
    world_dir = write_world(world, out / "world")
    write_world_tasks(world, world_dir, seed=p.world.seed)
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
    here = machine()
    if (here["torch_cpu_capability"], here["mkl_cbwr"].split(",")[0]) != (FLOAT_PATH, FLOAT_PATH):
        log.warning("torch computes with %s here (MKL path %r), the published sandbox family "
                    "with %s on both: the family trained here may differ (docs/sandbox.md)",
                    here["torch_cpu_capability"], here["mkl_cbwr"], FLOAT_PATH)
    report: dict = {"preset": preset, "sandbox_version": p.version, "world": asdict(p.world),
                    "seq_len": p.seq_len, "machine": here,
                    "loadavg_start": [round(x, 2) for x in os.getloadavg()], "models": {}}
    report["torch_threads"] = torch.get_num_threads()
    for spec in p.models:
        tok = toks[spec.tokenizer]
        folder = out / spec.name
        info_path = folder / "pretrain_info.json"
        info = json.loads(info_path.read_text()) if reuse and info_path.exists() else None
        if info is not None and info.get("key") == member_key(p, spec):
            model, tok = load_member(folder)
        else:
            if progress:
                log.info("pre-training %s: %d x %d %s, %d steps%s", spec.name, spec.num_layers,
                         spec.hidden_size, spec.arch, spec.steps,
                         f" + {spec.drill_steps} drill steps" if spec.drill_steps else "")
            info = _train_member(p, spec, tok, corpora[spec.corpus], folder, world,
                                 world_dir, drill_hay, niah_hay, progress)
            model, tok = load_member(folder)
        t_eval, c_eval = time.time(), cpu_seconds()
        entry = {**info, "describe": describe(model), "tokenizer": spec.tokenizer,
                 **loss_report(model, tok, corpora[spec.corpus], world.valid_docs, p.seq_len),
                 "mc_core_heldout": evaluate_world_mc(model, tok, world_dir, "core"),
                 "mc_specialist": evaluate_world_mc(model, tok, world_dir, "specialist",
                                                    ("dev", "val", "test"))}
        if spec.drill_steps or spec.reading_share:
            entry["mc_core_dev"] = evaluate_world_mc(model, tok, world_dir, "core", ("dev",))
            entry["niah"] = evaluate_niah(model, tok, niah_hay, p.niah, p.niah_samples)
            entry["openbook"] = _openbook(p, model, tok, world)
        if spec.reading_share:
            entry["reading"] = evaluate_reading(model, tok, world, niah_hay, p.reading_samples,
                                                p.reading_needle_tokens, p.openbook_filler)
        entry["eval_seconds"] = round(time.time() - t_eval, 1)
        entry["eval_cpu_seconds"] = round(cpu_seconds() - c_eval, 1)
        report["models"][spec.name] = entry
    report["total_seconds"] = round(time.time() - t0, 1)
    report["total_cpu_seconds"] = round(cpu_seconds() - c0, 1)
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["niah_chance"] = {"choice": 0.25, "single": 1e-5, "multikey": 0.25}
    write_json_atomic(out / "report.json", report)
    reading = reading_table(report)
    (out / "probes.md").write_text(probe_table(report) + (f"\n\n{reading}" if reading else "")
                                   + "\n")
    return report


def ensure_sandbox_models(preset: str = "sandbox", progress: bool = True) -> dict[str, Path]:
    """Paths of the preset's model folders. When a model is missing or was trained under
    another definition of the preset (an older world, spec or drill setting), the shipped
    family is installed if it was built from this definition (its hashes checked), else the
    preset is (re)trained: only those models train again. An installed shipped family is
    checked against its manifest each time."""
    p = get_preset(preset)
    root = preset_dir(preset)
    paths = {m.name: root / m.name for m in p.models}

    def missing() -> bool:
        return not family_current(preset, root)

    if missing():
        keys = {m.name: member_key(p, m) for m in p.models}
        shipped = shipped_keys(preset)
        if shipped is not None and shipped != keys:
            log.warning("the shipped sandbox family %r was built from another definition of "
                        "the preset; pre-training it here instead", preset)
        if shipped != keys or not install_shipped(preset, root) or missing():
            pretrain_preset(preset, root, progress=progress)
    verify_installed(preset, root)
    return paths


def family_current(preset: str, root: Path) -> bool:
    """Whether ``root`` holds every model of ``preset`` trained under its definition, and the
    report."""
    p = get_preset(preset)
    return (root / "report.json").exists() and \
        not any(_stale(p, spec, root / spec.name) for spec in p.models)


def _stale(p: Preset, spec: ModelSpec, folder: Path) -> bool:
    info = folder / "pretrain_info.json"
    if not (folder / "config.json").exists() or not info.exists():
        return True
    return json.loads(info.read_text()).get("key") != member_key(p, spec)


def sandbox_model(name: str, preset: str = "sandbox", progress: bool = True) -> Path:
    """The HF folder of one sandbox model (trained on first use); load with load_causal_lm."""
    names = [m.name for m in get_preset(preset).models]
    if name not in names:
        raise PlasticError(f"no sandbox model {name!r} in preset {preset!r}; choose one of "
                           f"{', '.join(names)}")
    return ensure_sandbox_models(preset, progress)[name]


def sandbox_world(preset: str = "sandbox", progress: bool = True) -> Path:
    """The world folder the preset's models were trained on."""
    ensure_sandbox_models(preset, progress)
    return preset_dir(preset) / "world"
