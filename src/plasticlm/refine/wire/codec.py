"""The wire format of FedRefine: KV caches and fusers as safetensors bytes, never pickle.

A *bundle* carries zero or more transmitters' caches (batch 1) and a JSON request. Its
safetensors metadata holds ``{"plasticlm": {"version", "request", "caches": [header, ...]}}``;
each header names the model, its cache layout (layers, kv heads, head dim), the layers sent,
the quantisation, the token count and a SHA-256 of the token ids. Cache ``i`` has tensors
``i.ids``, ``i.positions``, ``i.ends`` [T] (int32), ``i.inv_freq`` [D/2] and ``i.k``, ``i.v``
[L_sent, H, T, D] (plus ``i.k.scale`` [L_sent, H, 1, D] and ``i.v.scale`` [L_sent, H, T, 1]
when quantised): few tensors, so the header stays small beside short prompts.

The quantisations are the members of ``QUANTS`` (:mod:`plasticlm.refine.wire.quant`).
:func:`decode_bundle` checks everything before anything is used: size, header fields, the
exact tensor names, shapes, dtypes, finite values and the token hash.
"""

from __future__ import annotations

import hashlib
import json

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from plasticlm.config import to_dict
from plasticlm.errors import PlasticError
from plasticlm.refine.cache import KVCache, KVLayout
from plasticlm.refine.fusers.fuser import Fuser
from plasticlm.refine.fusers.fuser_config import config_from
from plasticlm.refine.peer import Transmission
from plasticlm.refine.wire.quant import QUANTS, SCALE_DTYPE, dequantise

CODEC_VERSION = 1
MAX_PAYLOAD_BYTES = 64 * 2**20
MAX_TOKENS = 4096
MAX_CACHES = 16
MAX_LAYERS = 256


class PayloadError(PlasticError):
    """A received payload is malformed, too large or does not fit the receiver (HTTP 4xx)."""


def _ids_digest(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.to(torch.int64).numpy().tobytes()).hexdigest()


def encode_bundle(transmissions: list[Transmission], request: dict | None = None,
                  quant: str = "bf16") -> bytes:
    """Transmissions and a JSON-able ``request`` as one safetensors payload."""
    QUANTS.check(quant)
    tensors: dict[str, torch.Tensor] = {}
    headers = []
    for i, tr in enumerate(transmissions):
        c = tr.cache
        if c.keys[0].shape[0] != 1:
            raise PlasticError("only batch-1 caches travel")
        ids = c.token_ids[0].cpu()
        headers.append({"model": c.model_name, "model_type": c.layout.model_type,
                        "num_layers": c.layout.num_layers, "num_kv_heads": c.num_kv_heads,
                        "head_dim": c.head_dim, "rope_scaling": c.layout.rope_scaling,
                        "layers": sorted(tr.layers), "quant": quant, "tokens": c.length,
                        "prompt_tokens": tr.prompt_tokens, "token_sha256": _ids_digest(ids),
                        "text_sha256": tr.text_sha256})
        tensors[f"{i}.ids"] = ids.to(torch.int32)
        tensors[f"{i}.positions"] = c.positions[0].cpu().to(torch.int32)
        tensors[f"{i}.ends"] = torch.tensor(tr.token_ends, dtype=torch.int32)
        tensors[f"{i}.inv_freq"] = c.layout.inv_freq.float().contiguous()
        sent = sorted(tr.layers)
        for kind, per, xs in (("k", "channel", c.keys), ("v", "token", c.values)):
            x = torch.stack([xs[layer][0].detach().cpu() for layer in sent])
            if not torch.isfinite(x).all():   # never sent: the receiver would refuse it anyway
                raise PlasticError(f"cache {i}: {kind} holds NaN or inf; nothing was sent")
            q, scale = QUANTS[quant].encode(x, per)
            tensors[f"{i}.{kind}"] = q
            if scale is not None:
                tensors[f"{i}.{kind}.scale"] = scale
    meta = {"version": CODEC_VERSION, "request": request or {}, "caches": headers}
    return st_save(tensors, metadata={"plasticlm": json.dumps(meta)})


def _need(header: dict, key: str, kind: type, lo: int | float | None = None,
          hi: int | float | None = None):
    value = header.get(key)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise PayloadError(f"cache header field {key!r} must be {kind.__name__}, got {value!r}")
    if lo is not None and value < lo or hi is not None and value > hi:
        raise PayloadError(f"cache header field {key!r} = {value} is outside [{lo}, {hi}]")
    return value


def _tensor(tensors: dict, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    t = tensors.get(name)
    if t is None:
        raise PayloadError(f"payload lacks tensor {name!r}")
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise PayloadError(f"tensor {name!r} is {tuple(t.shape)} {t.dtype}, the header says "
                           f"{shape} {dtype}")
    return t


def _decode_cache(i: int, h: dict, tensors: dict) -> tuple[Transmission, set[str]]:
    if not isinstance(h, dict):
        raise PayloadError(f"cache header {i} is not an object")
    n_layers = _need(h, "num_layers", int, 1, MAX_LAYERS)
    heads = _need(h, "num_kv_heads", int, 1, 1024)
    dim = _need(h, "head_dim", int, 2, 4096)
    tokens = _need(h, "tokens", int, 1, MAX_TOKENS)
    prompt_tokens = _need(h, "prompt_tokens", int, 1, tokens)
    quant = _need(h, "quant", str)
    if quant not in QUANTS:
        raise PayloadError(f"unknown cache quantisation {quant!r} (this peer reads "
                           f"{', '.join(QUANTS)})")
    codec = QUANTS[quant]
    layers = h.get("layers")
    if (not isinstance(layers, list) or not layers or len(set(layers)) != len(layers)
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n_layers
                       for x in layers)):
        raise PayloadError(f"cache header 'layers' must list distinct layers in [0, {n_layers}),"
                           f" got {layers!r}")
    model = _need(h, "model", str)
    model_type = _need(h, "model_type", str)
    scaling = _need(h, "rope_scaling", float, 1e-6, 1e6)
    used = set()

    def take(name, shape, dtype):
        used.add(f"{i}.{name}")
        return _tensor(tensors, f"{i}.{name}", shape, dtype)

    ids = take("ids", (tokens,), torch.int32).to(torch.int64)
    if _ids_digest(ids) != h.get("token_sha256"):
        raise PayloadError(f"cache {i}: token ids do not match their hash (damaged in transit)")
    positions = take("positions", (tokens,), torch.int32).to(torch.int64)
    ends = take("ends", (tokens,), torch.int32)
    if (positions < 0).any() or (positions > MAX_TOKENS * 4).any() or (ends < 0).any():
        raise PayloadError(f"cache {i}: negative or out-of-range positions or token ends")
    inv_freq = take("inv_freq", (dim // 2,), torch.float32)
    if not torch.isfinite(inv_freq).all():
        raise PayloadError(f"cache {i}: RoPE frequencies are not finite")
    empty = torch.zeros(1, heads, 0, dim)
    keys, values = [empty] * n_layers, [empty] * n_layers
    layers = sorted(layers)
    n = len(layers)
    for kind, scale_shape, out in (("k", (n, heads, 1, dim), keys),
                                   ("v", (n, heads, tokens, 1), values)):
        q = take(kind, (n, heads, tokens, dim), codec.stored)
        scale = take(f"{kind}.scale", scale_shape, SCALE_DTYPE) if codec.scaled else None
        x = dequantise(q, scale)
        if not torch.isfinite(x).all():
            raise PayloadError(f"cache {i}: {kind} holds NaN or inf")
        for j, layer in enumerate(layers):
            out[layer] = x[j][None]
    layout = KVLayout(model_type, n_layers, heads, dim, inv_freq, scaling)
    cache = KVCache(layout, keys, values, ids[None], positions[None],
                    torch.ones(1, tokens, dtype=torch.long), model)
    text_sha = h.get("text_sha256", "")
    if not isinstance(text_sha, str):
        raise PayloadError("cache header 'text_sha256' must be a string")
    return Transmission(cache, ends.tolist(), prompt_tokens, sorted(layers), text_sha), used


def _load_payload(data: bytes, max_bytes: int, what: str) -> dict[str, torch.Tensor]:
    # The size first: nothing of a too-large payload is parsed.
    if len(data) > max_bytes:
        raise PayloadError(f"{what} of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        return st_load(bytes(data))
    except (SafetensorError, ValueError, RuntimeError, TypeError) as e:
        raise PayloadError(f"{what} is not a safetensors file ({str(e)[:120]})") from None


def decode_bundle(data: bytes, max_bytes: int = MAX_PAYLOAD_BYTES
                  ) -> tuple[dict, list[Transmission]]:
    """``(request, transmissions)`` of a payload; :class:`PayloadError` names what is wrong."""
    tensors = _load_payload(data, max_bytes, "payload")
    meta = read_metadata(data, "plasticlm")
    version = meta.get("version") if isinstance(meta, dict) else None
    if version != CODEC_VERSION:
        raise PayloadError(f"payload codec version {version!r} is not {CODEC_VERSION}")
    request, headers = meta.get("request", {}), meta.get("caches")
    if not isinstance(request, dict) or not isinstance(headers, list):
        raise PayloadError("payload header needs a 'request' object and a 'caches' list")
    if len(headers) > MAX_CACHES:
        raise PayloadError(f"payload carries {len(headers)} caches (at most {MAX_CACHES})")
    out, used = [], set()
    for i, h in enumerate(headers):
        tr, names = _decode_cache(i, h, tensors)
        out.append(tr)
        used |= names
    extra = sorted(set(tensors) - used)
    if extra:
        raise PayloadError(f"payload has tensors its header does not describe: {extra[:4]}")
    for tr in out:
        tr.wire_bytes = len(data) // max(1, len(out))
    return request, out


def read_metadata(data: bytes, key: str):
    """The JSON under ``key`` in a payload's safetensors metadata (safetensors has no
    bytes-level metadata reader; its header is length-prefixed JSON)."""
    n = int.from_bytes(data[:8], "little")
    try:
        header = json.loads(data[8: 8 + n])
        return json.loads(header.get("__metadata__", {}).get(key, "null"))
    except (ValueError, AttributeError, TypeError, RecursionError):   # nested too deeply too
        raise PayloadError(f"payload metadata has no valid {key!r} entry") from None


def encode_fuser(fuser: Fuser) -> bytes:
    """A fuser (config and weights) as one safetensors payload."""
    state = {k: v.detach().contiguous().cpu() for k, v in fuser.state_dict().items()}
    return st_save(state, metadata={"plasticlm-fuser": json.dumps(to_dict(fuser.config))})


def decode_fuser(data: bytes, max_bytes: int = MAX_PAYLOAD_BYTES) -> Fuser:
    """The fuser of an :func:`encode_fuser` payload, checked against its own config."""
    state = _load_payload(data, max_bytes, "fuser payload")
    saved = read_metadata(data, "plasticlm-fuser")
    try:
        config = config_from(saved, "fuser payload")
    except PlasticError as e:
        raise PayloadError(str(e)) from None
    if any(not torch.isfinite(t).all() for t in state.values() if t.is_floating_point()):
        raise PayloadError("fuser payload holds NaN or inf weights")
    try:
        return Fuser.from_state(config, state, "fuser payload")
    except PlasticError as e:
        raise PayloadError(str(e)) from None
