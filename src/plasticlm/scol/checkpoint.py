"""Meta-training checkpoints: the policy as an HF folder, the optimiser's moments and the
preference buffer, swapped in atomically."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from plasticlm.config_files import loads_json
from plasticlm.errors import PlasticError
from plasticlm.runs import atomic_folder
from plasticlm.tensor_files import load_tensors


def save_optimizer(opt: torch.optim.Optimizer, path: Path) -> None:
    """The optimiser's per-parameter state (moments, step) as safetensors."""
    tensors = {}
    for idx, st in opt.state_dict()["state"].items():
        for name, value in st.items():
            tensors[f"{idx}.{name}"] = torch.as_tensor(value).contiguous()
    save_file(tensors, str(path))


def load_optimizer(opt: torch.optim.Optimizer, path: Path) -> None:
    """Restore what :func:`save_optimizer` wrote into ``opt``."""
    sd = opt.state_dict()
    state: dict[int, dict] = {}
    for key, value in load_tensors(path, "SCoL optimiser state").items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    sd["state"] = state
    opt.load_state_dict(sd)


def save_checkpoint(folder: Path, policy, tokenizer, opt, state: dict,
                    pairs: list[dict] | None = None) -> Path:
    """Policy (HF folder, safetensors), optimiser moments (safetensors), the preference
    buffer (``pairs.json``) and ``state.json``, written to a temporary folder then renamed so
    a crash never leaves half a checkpoint."""
    with atomic_folder(folder) as tmp:
        policy.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        save_optimizer(opt, tmp / "optimizer.safetensors")
        if pairs is not None:
            (tmp / "pairs.json").write_text(json.dumps(pairs) + "\n")
        (tmp / "state.json").write_text(json.dumps(state, indent=1) + "\n")
    return folder


def check_resumable(saved: Path, cfg) -> None:
    """Refuse to resume a run whose settings changed (more outer steps extend it), or whose
    saved config is missing or unreadable (nothing would say the checkpoint is of ``cfg``)."""
    if not saved.is_file():
        raise PlasticError(f"cannot resume: {saved} is missing, so nothing says the checkpoint "
                           "was made with this config; restore it, or start a new run folder")
    try:
        before = loads_json(saved.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise PlasticError(f"cannot resume: {saved} is not readable JSON ({e}); restore it, or "
                           "start a new run folder") from None
    if not isinstance(before, dict):
        raise PlasticError(f"cannot resume: {saved} is not a saved config")
    now = json.loads(json.dumps(asdict(cfg)))
    changed = sorted(k for k in set(before) | set(now)
                     if k != "outer_steps" and before.get(k) != now.get(k))
    if changed:
        raise PlasticError(f"cannot resume: the config changed since the checkpoint "
                           f"({', '.join(changed)}); only scol.outer_steps may change on "
                           "--resume. Start a new run folder instead.")
