"""Where a preset's pre-training stands: finished members, the member in training (its last
checkpoint's step and losses) and, when asked, that checkpoint's probes, read while the build
runs (it is never touched; a build writes its checkpoints atomically)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_model
from transformers import AutoTokenizer

from plasticlm.data.niah import haystack_sentences
from plasticlm.sandbox.member import build_model, load_member
from plasticlm.sandbox.presets import get_preset, preset_dir
from plasticlm.sandbox.pretrain import member_key
from plasticlm.sandbox.probes import evaluate_world_mc
from plasticlm.sandbox.reading_probes import evaluate_reading
from plasticlm.sandbox.world import generate_world


def _mean_every(losses: list[float], every: int) -> list[float]:
    return [round(sum(losses[i:i + every]) / len(losses[i:i + every]), 3)
            for i in range(0, len(losses), every)]


def build_progress(preset: str, probe: bool = False, n: int = 80) -> dict:
    """Per member of ``preset`` in its cache folder: ``done`` (a finished folder),
    ``training`` (its checkpoint's ``step`` of ``steps`` and mean loss per 500 steps) or
    ``waiting``; with ``probe``, a done or training member's reading probes and core
    held-out MC (``n`` items per reading probe)."""
    p = get_preset(preset)
    root = Path(preset_dir(preset))
    out: dict = {"folder": str(root), "members": {}}
    world = None
    for spec in p.models:
        ckpt = root / f"{spec.name}.ckpt" / "train"
        info = root / spec.name / "pretrain_info.json"
        if info.exists() and json.loads(info.read_text()).get("key") == member_key(p, spec):
            entry = {"state": "done"}
        elif (ckpt / "meta.json").exists():
            meta = json.loads((ckpt / "meta.json").read_text())
            entry = {"state": "training", "step": meta["step"], "steps": spec.steps,
                     "loss_every_500": _mean_every(meta["losses"], 500)}
        else:
            out["members"][spec.name] = {"state": "waiting"}
            continue
        if probe:
            world = world or generate_world(p.world)
            if entry["state"] == "done":
                model, tok = load_member(root / spec.name)
            else:
                tok = AutoTokenizer.from_pretrained(root / "tokenizers" / spec.tokenizer)
                model = build_model(spec, len(tok), max(2048, 4 * p.seq_len))
                load_model(model, str(ckpt / "model.safetensors"))
            model.eval()
            entry["reading"] = evaluate_reading(model, tok, world,
                                                haystack_sentences(world.valid_docs), n,
                                                p.reading_needle_tokens, p.openbook_filler)
            entry["mc_core_heldout"] = evaluate_world_mc(model, tok, root / "world", "core")["all"]
        out["members"][spec.name] = entry
    return out
