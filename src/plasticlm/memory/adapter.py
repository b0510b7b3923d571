"""Attach the memory to an HF decoder, pick out theta, save and load theta like a PEFT adapter.

theta (the meta-parameters FedNL federates) = per memory layer: LoRA A/B for q, k, v, the
beta projection, the gate logits, and the short convolution when ``conv_size > 0``.
Everything else is frozen by :func:`attach_memory`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from plasticlm.config import from_dict
from plasticlm.data.jsonl import read_json
from plasticlm.errors import PlasticError
from plasticlm.memory.config import MemoryConfig
from plasticlm.memory.export import append_model_card, refuse_plain_save
from plasticlm.memory.layer import MemoryAttention
from plasticlm.tensor_files import load_tensors

SUPPORTED = ("llama", "qwen2", "qwen3")
CONFIG_FILE = "memory_config.json"
THETA_FILE = "memory_theta.safetensors"


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED:
        raise PlasticError(
            f"memory attaches to {', '.join(SUPPORTED)} decoders; this model is {model_type!r}")
    return model.get_decoder().layers


def memory_config(model: nn.Module) -> MemoryConfig | None:
    """The :class:`MemoryConfig` attached to ``model``, or None."""
    return getattr(model, "memory_config", None)


def attach_memory(
    model: nn.Module,
    layers: list[int] | str | None = "all",
    window: int = 256,
    rank: int = 8,
    config: MemoryConfig | None = None,
    **options,
) -> nn.Module:
    """Replace every layer's ``self_attn`` by a windowed :class:`MemoryAttention`, with a
    memory branch in ``layers`` ("all", a list of indices, or None/[] for window only).

    Freezes all base parameters; only theta (:func:`meta_parameters`) stays trainable.
    Other options are :class:`MemoryConfig` fields (lora_alpha, conv_size, gate_init,
    chunk_size). Returns the same model, changed in place.

    >>> model = attach_memory(build_tiny("qwen3"), layers=[1], window=64, rank=4)  # doctest: +SKIP
    """
    decoder_layers = _decoder_layers(model)
    if memory_config(model) is not None:
        raise PlasticError("this model already has memory attached; attach to a fresh base model")
    n = len(decoder_layers)
    if config is None:
        if layers == "all":
            layers = list(range(n))
        elif layers is None:
            layers = []
        fields = {f.name for f in dataclasses.fields(MemoryConfig)}
        unknown = set(options) - fields
        if unknown:
            raise PlasticError(f"unknown memory option(s) {sorted(unknown)}; known: {sorted(fields)}")
        config = from_dict(MemoryConfig, {"layers": sorted(int(i) for i in layers),
                                          "window": window, "rank": rank, **options})
    if config.model_type and config.model_type != model.config.model_type:
        raise PlasticError(f"memory was built for {config.model_type!r}; this model is {model.config.model_type!r}")
    config = dataclasses.replace(config, layers=tuple(sorted(set(config.layers))),
                                 model_type=model.config.model_type)
    bad = [i for i in config.layers if not 0 <= i < n]
    if bad:
        raise PlasticError(f"memory layers {bad[:8]}{' ...' if len(bad) > 8 else ''} do not "
                           f"exist; the model has layers 0..{n - 1}")

    for p in model.parameters():
        p.requires_grad_(False)
    for i, layer in enumerate(decoder_layers):
        # theta: float32 whatever the base dtype, on the base's device (meta: see reset_theta)
        wrapped = MemoryAttention(layer.self_attn, config, with_memory=i in config.layers)
        for p in _theta_of(wrapped).values():
            p.requires_grad_(True)
        layer.self_attn = wrapped
    model.memory_config = config
    # its own save_pretrained would write wrapped names that load wrongly elsewhere (export.py)
    model.save_pretrained = refuse_plain_save
    # on the decoder, so that model(...) and model.get_decoder()(...) both set the mask
    model._memory_mask_hook = model.get_decoder().register_forward_pre_hook(
        _share_padding_mask, with_kwargs=True)
    return model


def reset_theta(model: nn.Module) -> nn.Module:
    """Initialise theta as :func:`attach_memory` does (same seed, same values), on the device
    of each layer's base weights. For a model built on the meta device: attach there, then
    ``model.to_empty(device=...)``, load the base weights, and call this."""
    if memory_config(model) is None:
        raise PlasticError("this model has no memory attached; call attach_memory first")
    for layer in model.get_decoder().layers:
        layer.self_attn.reset_theta()
    return model


def _share_padding_mask(decoder: nn.Module, args: tuple, kwargs: dict):
    """Before every decoder forward, hand its 2D padding mask ([B, T], 1 = token) to every
    memory layer, or None when there is none: attention modules receive only the backend's
    mask object (4D, BlockMask, 2D or None), from which padding cannot be read reliably."""
    mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
    if isinstance(mask, torch.Tensor) and mask.dim() != 2:
        raise PlasticError(f"a memory-attached model takes a 2D padding mask [B, T] (1 = token), "
                           f"not shape {tuple(mask.shape)}: its layers build their own window")
    real = mask.bool() if isinstance(mask, torch.Tensor) else None
    if real is not None and bool(real.all()):
        real = None
    for layer in decoder.layers:
        layer.self_attn.token_mask = real


def detach_memory(model: nn.Module) -> nn.Module:
    """Put the original attention modules back (theta is dropped)."""
    if memory_config(model) is None:
        raise PlasticError("this model has no memory attached")
    for layer in model.get_decoder().layers:
        layer.self_attn.token_mask = None
        layer.self_attn = layer.self_attn.base
    model._memory_mask_hook.remove()
    del model.memory_config, model._memory_mask_hook, model.save_pretrained
    return model


def _theta_of(module: MemoryAttention) -> dict[str, nn.Parameter]:
    return {n: p for n, p in module.named_parameters() if not n.startswith("base.")}


def meta_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """theta by name (``layers.<i>.<lora_q.A|...|gate_logit>``): exactly the memory's own
    parameters, none of the base model's."""
    if memory_config(model) is None:
        raise PlasticError("this model has no memory attached; call attach_memory first")
    theta = {}
    for i, layer in enumerate(model.get_decoder().layers):
        for name, p in _theta_of(layer.self_attn).items():
            theta[f"layers.{i}.{name}"] = p
    return theta


def theta_bytes(model: nn.Module) -> int:
    """Bytes of theta as stored (what FedNL sends per round)."""
    return sum(p.numel() * p.element_size() for p in meta_parameters(model).values())


def save_pretrained(model: nn.Module, directory: str | Path) -> int:
    """Write theta (safetensors) and its :class:`MemoryConfig` (JSON); returns theta's bytes."""
    config = memory_config(model)
    if config is None:
        raise PlasticError("this model has no memory attached; nothing to save")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    theta = {k: v.detach().contiguous().cpu() for k, v in meta_parameters(model).items()}
    save_file(theta, str(directory / THETA_FILE), metadata={"format": "plasticlm-memory"})
    (directory / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")
    if not (directory / "README.md").exists():
        append_model_card(directory, f"""# plasticlm memory adapter

theta of a delta-rule memory ({len(config.layers)} layers, window {config.window}) for a
{config.model_type} base model; transformers and PEFT do not load it on their own: load it with
`plasticlm.memory.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), FOLDER)`.""")
    return sum(t.numel() * t.element_size() for t in theta.values())


def load_theta(model: nn.Module, directory: str | Path) -> None:
    """Copy saved theta into a model that already has the same memory attached."""
    _copy_theta(model, _read_theta(directory))


def _read_theta(directory: str | Path) -> dict[str, torch.Tensor]:
    path = Path(directory) / THETA_FILE
    if not path.exists():
        raise PlasticError(f"{path} does not exist; save theta with plasticlm.memory.save_pretrained")
    return load_tensors(path, "memory adapter")


def _copy_theta(model: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    theta = meta_parameters(model)
    missing, extra = sorted(set(theta) - set(saved)), sorted(set(saved) - set(theta))
    if missing or extra:
        raise PlasticError(f"saved theta does not fit this model: missing {missing[:5]}, unexpected {extra[:5]}")
    on_meta = [n for n, p in theta.items() if p.is_meta]
    if on_meta:
        raise PlasticError(f"theta {on_meta[0]} is on the meta device: materialise the model "
                           "(model.to_empty(device=...) and the base weights) and call "
                           "reset_theta(model) before loading theta")
    with torch.no_grad():
        for name, p in theta.items():
            if saved[name].shape != p.shape:
                raise PlasticError(f"theta {name}: saved shape {tuple(saved[name].shape)} != {tuple(p.shape)}")
            p.copy_(saved[name])


def from_pretrained(model: nn.Module, directory: str | Path) -> nn.Module:
    """Attach memory to base ``model`` with the saved config, then load the saved theta. A
    config the saved theta cannot back is refused before anything is built, and a refused
    adapter leaves ``model`` as it was."""
    path = Path(directory) / CONFIG_FILE
    if not path.exists():
        raise PlasticError(f"{path} does not exist; is {directory} a saved memory adapter?")
    try:
        config = from_dict(MemoryConfig, read_json(path, "memory adapter config"))
    except PlasticError as e:
        raise PlasticError(f"{path} is not a memory adapter config ({e})") from None
    saved = _read_theta(directory)
    # the sizes theta is built from (the model gives the rest) must appear in the saved
    # tensors' shapes: a rank of 10^9 is refused here, not allocated
    largest = max((max(t.shape, default=0) for t in saved.values()), default=0)
    if config.layers and max(config.rank, config.conv_size) > largest:
        raise PlasticError(f"{path}: rank {config.rank} or conv_size {config.conv_size} does not "
                           f"fit the saved theta (no dimension above {largest})")
    attach_memory(model, config=config)
    try:
        _copy_theta(model, saved)
    except PlasticError:
        detach_memory(model)
        raise
    return model
