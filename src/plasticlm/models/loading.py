"""Load any Hugging Face causal LM, from a local folder or a hub id."""

from __future__ import annotations

import math
import os
from pathlib import Path

from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from plasticlm.config_files import loads_json
from plasticlm.errors import PlasticError, clip
from plasticlm.runtime import pick_device, pick_dtype

# The families every method is tested on; others load but are not promised to work.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


def check_model_source(name_or_path: str | Path) -> None:
    """Refuse, before any work, a model that is neither a Hugging Face model folder nor a hub
    id (``org/name``): a missing path, or a folder without config.json."""
    text = str(name_or_path)
    try:
        path = Path(text).expanduser()
        exists = path.exists()
    except (OSError, ValueError) as e:   # a name too long for the file system, a NUL byte
        raise PlasticError(f"model {clip(text)!r} is neither a folder nor a hub id "
                           f"({getattr(e, 'strerror', None) or e})") from None
    if exists:
        if not (path / "config.json").is_file():
            raise PlasticError(
                f"{path} exists but holds no config.json: it is not a Hugging Face model folder "
                "(save one with model.save_pretrained(dir), or import llama2.c weights with "
                "`plasticlm models import-llama2c`)")
        _check_config(path / "config.json")
        return
    if path.is_absolute() or text.startswith((".", "~")) or text.count("/") != 1:
        raise PlasticError(f"model folder {clip(text)} does not exist (and it is not a hub id "
                           "such as Qwen/Qwen2.5-0.5B)")
    check_hub_id(text)


# seconds the hub may take to answer whether it holds a model, once, with no retries
HUB_TIMEOUT_S = 10.0


def hub_offline() -> bool:
    """Whether the user switched the Hugging Face hub off (``HF_HUB_OFFLINE``)."""
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on")


def check_hub_id(repo: str) -> None:
    """Refuse, within seconds and before any work, a hub id whose model cannot be had: not in
    the local Hugging Face cache while the hub is offline (``HF_HUB_OFFLINE``) or cannot be
    reached, or no such (or no accessible) model. One request, no retries; transformers would
    retry for most of a minute."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo, "config.json"), str):
        return
    fix = (f"download it on a connected machine (`huggingface-cli download {repo} --local-dir "
           "DIR`) and pass DIR instead")
    if hub_offline():
        raise PlasticError(f"model {repo} is a hub id that is not in the local Hugging Face "
                           f"cache, and the hub is off (HF_HUB_OFFLINE): {fix}")
    try:
        get_hf_file_metadata(hf_hub_url(repo, "config.json"), timeout=HUB_TIMEOUT_S)
    except Exception as e:   # unreachable, no such model, gated: each refused the same way
        reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise PlasticError(f"model {repo} is not a local folder and the Hugging Face hub did "
                           f"not give its config.json ({reason}): {fix}") from None


def _rope_values(value, where: str):
    """Every number of a RoPE setting with where it is (booleans and names skipped)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _rope_values(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _rope_values(v, f"{where}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield where, value


def _check_config(path: Path) -> None:
    """A model's config.json read as outside input: strict JSON (no NaN, no key twice), and
    RoPE settings that are finite positive numbers (a NaN factor would give NaN logits)."""
    try:
        config = loads_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise PlasticError(f"{path} is not a readable model config ({clip(e)}): save or copy "
                           "the model folder again") from None
    if not isinstance(config, dict):
        raise PlasticError(f"{path} is not a model config (a JSON object of settings)")
    for key in ("rope_scaling", "rope_parameters", "rope_theta"):
        for where, number in _rope_values(config.get(key), key):
            if not (math.isfinite(number) and number > 0):
                raise PlasticError(f"{path}: {where} is {number}, not a finite number > 0")


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
    try:
        path = Path(name_or_path).expanduser()
        is_local = path.exists()
    except (OSError, ValueError):   # a name too long for a path: refused there, in one line
        check_model_source(name_or_path)
        raise
    check_model_source(path if is_local else name_or_path)   # a hub id: asked once, now
    source = str(path) if is_local else str(name_or_path)
    offline = hub_offline()
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
