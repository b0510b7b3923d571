"""The cache codec: exact in float32, bounded error when quantised, and every payload checked
before use (hypothesis for the maths, hand-made damage for the checks)."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from plasticlm.refine.cache import KVCache, KVLayout
from plasticlm.refine.fusers.fuser import Fuser
from plasticlm.refine.peer import Transmission, text_digest
from plasticlm.refine.wire.codec import (
    PayloadError,
    decode_bundle,
    decode_fuser,
    encode_bundle,
    encode_fuser,
    read_metadata,
)


def _transmission(layers=3, heads=2, tokens=5, dim=8, seed=0, scale=1.0) -> Transmission:
    g = torch.Generator().manual_seed(seed)
    layout = KVLayout("llama", layers, heads, dim, torch.rand(dim // 2, generator=g))
    keys = [scale * torch.randn(1, heads, tokens, dim, generator=g) for _ in range(layers)]
    values = [scale * torch.randn(1, heads, tokens, dim, generator=g) for _ in range(layers)]
    ids = torch.randint(0, 500, (1, tokens), generator=g)
    cache = KVCache(layout, keys, values, ids, torch.arange(tokens)[None],
                    torch.ones(1, tokens, dtype=torch.long), "t")
    return Transmission(cache, [0, *range(3, 3 + 2 * (tokens - 1), 2)], tokens,
                        list(range(layers)), text_digest("a prompt"))


@settings(max_examples=25, deadline=None)
@given(heads=st.integers(1, 3), tokens=st.integers(1, 9), half=st.integers(1, 6),
       seed=st.integers(0, 10**6), scale=st.floats(1e-3, 1e3))
def test_float32_is_exact_and_quantised_error_is_bounded(heads, tokens, half, seed, scale):
    tr = _transmission(2, heads, tokens, 2 * half, seed, scale)
    request = {"prompt": "a prompt", "n": 3}
    got_request, (exact,) = decode_bundle(encode_bundle([tr], request, "float32"))
    assert got_request == request
    for a, b in zip(tr.cache.keys + tr.cache.values, exact.cache.keys + exact.cache.values):
        assert torch.equal(a, b)
    assert torch.equal(exact.cache.token_ids, tr.cache.token_ids)
    assert exact.token_ends == tr.token_ends and exact.text_sha256 == tr.text_sha256
    # Error bounds per element: int8 half a step of the per-channel (keys) / per-token
    # (values) scale (value scales are bf16, rounded up by < 2^-6); fp8 e4m3 1/16 of the
    # value (3 mantissa bits) plus half its smallest subnormal step; bf16 2^-8 of the value.
    for quant in ("int8", "fp8", "bf16"):
        _, (q,) = decode_bundle(encode_bundle([tr], quant=quant))
        for kind, per in (("keys", 2), ("values", 3)):
            for a, b in zip(getattr(tr.cache, kind), getattr(q.cache, kind)):
                amax = a.abs().amax(dim=per, keepdim=True)
                bound = {"int8": amax * (0.5 / 127) * (1 + 2**-6),   # bf16 scale, rounded up
                         "fp8": a.abs() / 16 + amax * 2**-15,
                         "bf16": a.abs() * 2**-8}[quant] * (1 + 1e-5)
                assert ((a - b).abs() <= bound).all(), (quant, kind)


def test_int8_takes_at_least_3_5x_fewer_bytes_than_float32_at_a_real_layout():
    # The sandbox transmitters' layout: 6 layers, 2 kv heads of 32 dims; a 64-token prompt.
    tr = _transmission(6, 2, 64, 32)
    f32, int8 = (len(encode_bundle([tr], quant=q)) for q in ("float32", "int8"))
    assert f32 / int8 >= 3.5


def _tamper(bundle: bytes, header=None, tensors=None) -> bytes:
    meta = read_metadata(bundle, "plasticlm")
    if header:
        meta["caches"][0].update(header)
    ts = st_load(bundle)
    ts.update(tensors or {})
    return st_save(ts, metadata={"plasticlm": json.dumps(meta)})


@pytest.mark.parametrize("damage, message", [
    (dict(header={"token_sha256": "0" * 64}), "hash"),
    (dict(header={"layers": [0, 7]}), "layers"),
    (dict(header={"layers": [0, 0]}), "layers"),
    (dict(header={"tokens": 10**9}), "tokens"),
    (dict(header={"num_kv_heads": "2"}), "num_kv_heads"),
    (dict(header={"quant": "int4"}), "quantisation"),
    (dict(header={"prompt_tokens": 0}), "prompt_tokens"),
    (dict(tensors={"0.v": torch.full((3, 2, 5, 8), float("inf"))}), "NaN or inf"),
    (dict(tensors={"0.positions": -torch.ones(5, dtype=torch.int32)}), "positions"),
    (dict(tensors={"0.k9": torch.zeros(2, 5, 8)}), "does not describe"),
    (dict(tensors={"0.k": torch.zeros(2, 2, 5, 8)}), "header says"),
])
def test_damaged_payloads_are_refused_with_the_reason(damage, message):
    good = encode_bundle([_transmission()], {"prompt": "p"}, "float32")
    with pytest.raises(PayloadError, match=message):
        decode_bundle(_tamper(good, **damage))


def test_size_limit_and_foreign_files_are_refused_before_parsing():
    good = encode_bundle([_transmission()], quant="int8")
    with pytest.raises(PayloadError, match="exceeds"):
        decode_bundle(good, max_bytes=len(good) - 1)
    foreign = st_save({"x": torch.zeros(2)})
    with pytest.raises(PayloadError, match="version|metadata"):
        decode_bundle(foreign)
    with pytest.raises(PayloadError, match="not a safetensors"):
        decode_bundle(b"\x80\x04\x95" + b"\0" * 64)


def test_fuser_travels_exactly_and_a_damaged_one_is_refused():
    r = KVLayout("qwen3", 3, 1, 16, torch.rand(8))
    t = KVLayout("llama", 2, 1, 16, torch.rand(8))
    fuser = Fuser.for_pair(r, t, rank=4)
    back = decode_fuser(encode_fuser(fuser))
    assert back.config == fuser.config
    for (k, a), (_, b) in zip(fuser.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k
    state = {k: v.clone() for k, v in fuser.state_dict().items()}
    first = next(k for k in state if k.endswith("weight"))
    state[first][0] = float("nan")
    meta = {"plasticlm-fuser": json.dumps(read_metadata(encode_fuser(fuser), "plasticlm-fuser"))}
    with pytest.raises(PayloadError, match="NaN"):
        decode_fuser(st_save(state, metadata=meta))
    for name in (first, "transmitter_inv_freq"):
        damaged = {**fuser.state_dict(), name: torch.zeros(3)}
        with pytest.raises(PayloadError, match="does not match"):
            decode_fuser(st_save(damaged, metadata=meta))


@pytest.mark.parametrize("quant", ["float32", "bf16", "int8", "fp8"])
@pytest.mark.parametrize("kind", ["k", "v"])
def test_non_finite_keys_and_values_are_neither_sent_nor_received(quant, kind):
    """A cache holding NaN or inf in its keys or values is refused by the sender, and a payload
    whose keys or values decode to NaN or inf (stored values or their scales) by the receiver,
    under every quantisation."""
    from plasticlm.errors import PlasticError

    for bad in (float("nan"), float("inf")):
        tr = _transmission()
        getattr(tr.cache, "keys" if kind == "k" else "values")[1][0, 0, 2, 3] = bad
        with pytest.raises(PlasticError, match=f"{kind} holds NaN or inf"):
            encode_bundle([tr], quant=quant)
        good = encode_bundle([_transmission()], quant=quant)
        stored = st_load(good)
        # scaled quantisations (int8, fp8: e4m3 has no inf) carry the damage in the scale
        name = f"0.{kind}.scale" if quant in ("int8", "fp8") else f"0.{kind}"
        damaged = stored[name].float().clone()
        damaged.view(-1)[3] = bad
        with pytest.raises(PayloadError, match=f"{kind} holds NaN or inf"):
            decode_bundle(_tamper(good, tensors={name: damaged.to(stored[name].dtype)}))
