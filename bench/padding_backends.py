"""Memory attention under each attention backend: how much left padding changes each row's
hidden states and last logits (padded in a batch vs alone), at the published shapes (2 layers,
random weights, memory on every layer with its gate open), float32, on this machine.

    .venv/bin/python bench/padding_backends.py           # writes results/padding_backends.json
    .venv/bin/python bench/padding_backends.py --smoke   # one shape cut to 1 layer, nothing written

flash_attention_2 is measured where ``flash_attn`` is installed (a CUDA machine).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch
import transformers.masking_utils as masking_utils

from plasticlm.memory import attach_memory, meta_parameters
from plasticlm.memory.checks import left_padding_gap
from plasticlm.models import load_causal_lm
from plasticlm.models.shapes import TESTED_SHAPES
from plasticlm.sandbox import resolve_model_spec

ROOT = Path(__file__).resolve().parents[1]


def backends() -> list[str]:
    found = ["eager", "sdpa", "flex_attention"]
    if importlib.util.find_spec("flash_attn") and torch.cuda.is_available():
        found.append("flash_attention_2")
    return found


def gaps(shape: str, layers: int = 2) -> dict[str, float]:
    model, tok = load_causal_lm(resolve_model_spec(f"shape:{shape}@{layers}"), dtype="float32",
                                device="cpu")
    attach_memory(model, layers="all", window=8, rank=4, gate_init=0.0)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        for name, p in meta_parameters(model).items():
            if "lora" in name:  # LoRA B starts at zero: give the memory's q/k/v a change
                p.add_(0.1 * torch.randn_like(p))
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(1, len(tok), (t,), generator=gen) for t in (8, 12)]
    out = {}
    for impl in backends():
        model.set_attn_implementation(impl)
        out[impl] = left_padding_gap(model, seqs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true",
                    help="one shape cut to 1 layer; print, write nothing")
    args = ap.parse_args()
    # flex_attention's BlockMask without torch.compile (slow on a CPU); memory layers build
    # their own masks from the 2D padding mask and never read it
    build = masking_utils.create_block_mask
    masking_utils.create_block_mask = lambda *a, _compile=False, **k: build(*a, _compile=False,
                                                                            **k)
    shapes = TESTED_SHAPES[:1] if args.smoke else TESTED_SHAPES
    result = {s: gaps(s, 1 if args.smoke else 2) for s in shapes}
    impls = backends()
    lines = ["| shape | " + " | ".join(impls) + " |", "|---" * (len(impls) + 1) + "|"]
    lines += [f"| {s} | " + " | ".join(f"{g[i]:.1e}" for i in impls) + " |"
              for s, g in result.items()]
    print("\n".join(lines))
    if not args.smoke:
        path = ROOT / "bench" / "results" / "padding_backends.json"
        path.write_text(json.dumps({"max_gap": result, "table": "\n".join(lines)}, indent=1)
                        + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
