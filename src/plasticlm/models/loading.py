"""Load any Hugging Face causal LM, from a local folder or a hub id."""

from __future__ import annotations

import os
from pathlib import Path

from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from plasticlm.errors import PlasticError
from plasticlm.runtime import pick_device, pick_dtype

# The families every method is tested on; others load but are not promised to work.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


def check_model_source(name_or_path: str | Path) -> None:
    """Refuse, before any work, a model that is neither a Hugging Face model folder nor a hub
    id (``org/name``): a missing path, or a folder without config.json."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise PlasticError(
                f"{path} exists but holds no config.json: it is not a Hugging Face model folder "
                "(save one with model.save_pretrained(dir), or import llama2.c weights with "
                "`plasticlm models import-llama2c`)")
        return
    if path.is_absolute() or text.startswith((".", "~")) or text.count("/") != 1:
        raise PlasticError(f"model folder {text} does not exist (and it is not a hub id "
                           "such as Qwen/Qwen2.5-0.5B)")


def load_causal_lm(name_or_path: str | Path, dtype=None, device=None):
    """Load ``(model, tokenizer)`` for a causal LM from a local folder or a hub id.

    A local folder is used as is. A hub id is looked up in the local Hugging Face cache
    first; when it is not there and the machine is offline (``HF_HUB_OFFLINE=1`` or no
    network), the error names the model and says how to provide it as a local path.
    The model is returned in eval mode, in ``dtype`` on ``device``; by default those of the
    run (the command's ``--dtype``/``--device``: :func:`plasticlm.runtime.runtime`), else
    float32 on CUDA when present, else on the CPU.
    """
    hf_logging.disable_progress_bar()  # a bar per shard of a local folder is noise
    torch_dtype, device = pick_dtype(dtype), pick_device(device)
    path = Path(name_or_path).expanduser()
    is_local = path.exists()
    if is_local:
        check_model_source(path)
    source = str(path) if is_local else str(name_or_path)
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=is_local or offline)
        # use_kernels=False: transformers would otherwise fetch layer kernels from the hub
        # on CUDA (and fail where the `kernels` package or the network is missing)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, local_files_only=is_local or offline, use_kernels=False
        )
    except (OSError, ValueError, SafetensorError) as e:
        if is_local:
            raise PlasticError(f"could not load the model folder {path}: {e} (a truncated or "
                               "damaged weights file: save or copy the folder again)") from None
        raise PlasticError(
            f"model {name_or_path!r} is not a local folder and could not be fetched from the "
            "Hugging Face hub (offline, or no such model). Download it on a connected machine "
            "(e.g. `huggingface-cli download "
            f"{name_or_path} --local-dir DIR`) and pass DIR as a local path instead."
        ) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    model.to(device)
    model.eval()
    return model, tokenizer


def describe(model) -> dict:
    """A small summary of a causal LM: type, depth, width, heads, parameters, dtype, device."""
    cfg = model.config
    return {
        "model_type": cfg.model_type,
        "layers": cfg.num_hidden_layers,
        "hidden": cfg.hidden_size,
        "heads": cfg.num_attention_heads,
        "kv_heads": getattr(cfg, "num_key_value_heads", cfg.num_attention_heads),
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "vocab": cfg.vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "device": str(next(model.parameters()).device),
    }
