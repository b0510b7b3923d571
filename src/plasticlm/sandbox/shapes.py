"""``shape:<name>[@<layers>]`` specs: a real-shape model (published configuration, random
weights, full vocabulary, depth cut) saved as an HF folder with the quick sandbox's tokenizer,
so that every command can run at the shapes users bring without downloading anything.

>>> shape_spec_of("shape:qwen3-0.6b@2")
('qwen3-0.6b', 2)
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer

from plasticlm.errors import PlasticError
from plasticlm.models.shapes import build_shape, check_shape
from plasticlm.runs import atomic_folder, cache_home
from plasticlm.sandbox.pretrain import sandbox_model

PREFIX = "shape:"
# The tokenizer every shape folder carries: it reads the sandbox world's text, so the
# sandbox's data runs on real shapes, and it is far smaller than any real logits width.
TOKENIZER_OF = ("receiver", "quick")


def shape_spec_of(spec: str) -> tuple[str, int | None] | None:
    """(shape, layers or None for all) of a ``shape:`` spec; None for any other spec."""
    if not spec.startswith(PREFIX):
        return None
    name, _, layers = spec[len(PREFIX):].partition("@")
    if layers and not layers.isdigit():
        raise PlasticError(f"{spec}: the depth after '@' must be a whole number of layers")
    depth = int(layers) if layers else None
    check_shape(name, depth)
    return name, depth


def shape_model(name: str, num_layers: int | None = None, seed: int = 0,
                progress: bool = False) -> Path:
    """The HF folder of shape ``name`` cut to ``num_layers``, built on first use."""
    check_shape(name, num_layers)
    folder = cache_home() / "shapes" / f"{name}-L{num_layers or 'all'}-s{seed}"
    if (folder / "config.json").exists() and (folder / "shape.json").exists():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(sandbox_model(*TOKENIZER_OF, progress=progress))
    model = build_shape(name, num_layers, tokenizer, seed=seed)
    with atomic_folder(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "shape.json").write_text(json.dumps(
            {"shape": name, "num_layers": num_layers, "seed": seed,
             "tokenizer": f"{TOKENIZER_OF[1]}:{TOKENIZER_OF[0]}"}) + "\n")
    return folder
