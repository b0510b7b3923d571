"""FedNL's bytes per client and round at the paper's shape (Qwen2.5-1.5B), with the placement
of ``configs/fednl-paper-qwen2.5-1.5b.toml``, beside the paper's 0.26 MB, LoRA-FedAvg at the
same rank (q/k/v of every layer, the baseline's adapter) and FedNL's memory on every layer.

Bytes are what travels: theta packed as the Flower ArrayRecord a client sends
(``fednl.messages.pack_theta``, ``count_bytes``), float32 and float16. The models are built on
the meta device (shapes only), so this takes seconds and no weights.

    .venv/bin/python bench/fednl_paper_placement.py            # writes results/fednl_paper_placement.json
    .venv/bin/python bench/fednl_paper_placement.py --smoke    # the 0.5B shape, nothing written
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from plasticlm.config import load_config
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.config_sections import MemoryOptions, MethodConfig
from plasticlm.fednl.flower.messages import pack_theta
from plasticlm.fednl.methods import prepare_model
from plasticlm.fednl.theta import trainable
from plasticlm.models.shapes import shape_config

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "configs" / "fednl-paper-qwen2.5-1.5b.toml"
PAPER_MB = {"fednl": 0.26, "fedavg": 22.5}


def wire_bytes(shape: str, method: MethodConfig, memory: MemoryOptions, dtype: str) -> int:
    """Bytes of the ArrayRecord one client sends for ``method``'s theta (with ``memory``,
    fednl's memory branch) at ``shape``."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            shape_config(shape, bos_token_id=1, eos_token_id=2, pad_token_id=0))
    model = prepare_model(model, method, memory)
    theta = {n: torch.zeros(p.shape) for n, p in trainable(model).items()}
    return pack_theta(theta, dtype).count_bytes()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="the 0.5B shape; print, write nothing")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fednl_paper_placement.json"))
    args = ap.parse_args()
    cfg = load_config(FedNLConfig, PRESET)
    shape = "qwen2.5-0.5b" if args.smoke else "qwen2.5-1.5b"
    if args.smoke:  # the 0.5B shape has 24 layers: its last is 23
        cfg = dataclasses.replace(cfg, memory=dataclasses.replace(cfg.memory, layers="23"))
    r = cfg.method.lora_rank
    rows = {
        f"fednl, preset (memory on layer {cfg.memory.layers}, r{r}, no conv)":
            (cfg.method, cfg.memory),
        f"fednl, memory on every layer (r{r}, conv 4)":
            (cfg.method, dataclasses.replace(cfg.memory, layers="all", conv_size=4)),
        f"fedavg LoRA r{r} on q/k/v of every layer (same rank)":
            (MethodConfig(name="fedavg", lora_rank=r, window=cfg.method.window),
             MemoryOptions()),
    }
    result = {"shape": shape, "preset": str(PRESET.relative_to(ROOT)), "paper_mb": PAPER_MB,
              "rows": {}}
    preset_bytes = None
    lines = [f"| theta at {shape} | MB up per client, float32 | float16 | vs the preset |",
             "|---|---|---|---|"]
    for label, (method, memory) in rows.items():
        b32, b16 = (wire_bytes(shape, method, memory, dtype) for dtype in ("float32", "float16"))
        preset_bytes = preset_bytes or b32
        result["rows"][label] = {"float32": b32, "float16": b16}
        lines.append(f"| {label} | {b32 / 1e6:.3f} | {b16 / 1e6:.3f} | {b32 / preset_bytes:.1f}x |")
    lines.append(f"| paper: FedNL / FedAvg's trainable adapter | {PAPER_MB['fednl']} / "
                 f"{PAPER_MB['fedavg']} | - | {PAPER_MB['fedavg'] / PAPER_MB['fednl']:.0f}x |")
    result["table"] = "\n".join(lines)
    print(result["table"])
    if not args.smoke:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
