"""The stories260K import against llama2.c's own encoder and forward pass."""

import struct

import numpy as np
import pytest
import torch

from plasticlm.cli import main
from plasticlm.errors import PlasticError
from plasticlm.models import from_llama2c

REFERENCE = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
             "in the park.")


@pytest.fixture(scope="module")
def files(shared_data):
    d = shared_data / "models" / "stories260K"
    if not (d / "stories260K.bin").exists():
        pytest.skip(f"{d} is absent")
    return d / "stories260K.bin", d / "tok512.bin"


@pytest.fixture(scope="module")
def imported(files):
    return from_llama2c(*files)


@pytest.fixture(scope="module")
def stories(shared_data):
    text = (shared_data / "tinystories" / "tinystories_sample.txt").read_text()
    return [s.strip() for s in text.split("<|endoftext|>") if s.strip()]


def llama2c_encode(text: str, tok_bin, vocab_size=512) -> list[int]:
    """llama2.c's run.c encoder, transcribed: BOS, dummy prefix, chars with byte fallback,
    then repeatedly merge the best-scoring adjacent pair."""
    raw = tok_bin.read_bytes()
    pos, toks, scores = 4, [], []
    for _ in range(vocab_size):
        s, n = struct.unpack_from("<fi", raw, pos)
        toks.append(raw[pos + 8 : pos + 8 + n])
        scores.append(s)
        pos += 8 + n
    lookup = {t: i for i, t in enumerate(toks)}
    ids = [1, lookup[b" "]] if text else [1]
    for ch in text:
        b = ch.encode()
        ids += [lookup[b]] if b in lookup else [x + 3 for x in b]
    while True:
        best, at = None, -1
        for i in range(len(ids) - 1):
            j = lookup.get(toks[ids[i]] + toks[ids[i + 1]])
            if j is not None and (best is None or scores[j] > scores[best]):
                best, at = j, i
        if best is None:
            return ids
        ids[at : at + 2] = [best]


def llama2c_logits(model_bin, ids: list[int]) -> torch.Tensor:
    """A direct transcription of run.c's forward (interleaved RoPE) for one sequence."""
    raw = model_bin.read_bytes()
    dim, hid, L, H, KV, V, _ = struct.unpack_from("<7i", raw)
    w = torch.from_numpy(np.frombuffer(raw, dtype="<f4", offset=28).copy())
    hs, V, o = dim // H, abs(V), 0

    def take(*shape):
        nonlocal o
        n = int(np.prod(shape))
        o += n
        return w[o - n : o].view(*shape)

    emb, ra = take(V, dim), take(L, dim)
    wq, wk, wv = take(L, H * hs, dim), take(L, KV * hs, dim), take(L, KV * hs, dim)
    wo, rf = take(L, dim, H * hs), take(L, dim)
    w1, w2, w3, rfin = take(L, hid, dim), take(L, dim, hid), take(L, hid, dim), take(dim)

    def rms(x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * g

    T = len(ids)
    ang = torch.arange(T).float()[:, None] / 10000.0 ** (torch.arange(0, hs, 2).float() / hs)
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]

    def rope(x):
        a, b = x.view(T, -1, hs // 2, 2).unbind(-1)
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).view(T, -1, hs)

    x = emb[torch.tensor(ids)]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for i in range(L):
        h = rms(x, ra[i])
        q = rope((h @ wq[i].T).view(T, H, hs))
        k = rope((h @ wk[i].T).view(T, KV, hs)).repeat_interleave(H // KV, 1)
        v = (h @ wv[i].T).view(T, KV, hs).repeat_interleave(H // KV, 1)
        att = (torch.einsum("thd,shd->hts", q, k) / hs**0.5).masked_fill(mask, -1e9).softmax(-1)
        x = x + torch.einsum("hts,shd->thd", att, v).reshape(T, -1) @ wo[i].T
        h = rms(x, rf[i])
        x = x + (torch.nn.functional.silu(h @ w1[i].T) * (h @ w3[i].T)) @ w2[i].T
    return rms(x, rfin) @ emb.T


def test_greedy_from_bos_reproduces_reference(imported):
    model, tok = imported
    out = model.generate(torch.tensor([[tok.bos_token_id]]), max_new_tokens=40, do_sample=False,
                         pad_token_id=tok.pad_token_id)
    assert tok.decode(out[0], skip_special_tokens=True).startswith(REFERENCE)


def test_logits_match_llama2c_forward(imported, files, stories):
    model, tok = imported
    ids = tok(stories[1]).input_ids[:200]
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0]
    assert torch.allclose(ours, llama2c_logits(files[0], ids), atol=1e-3)


def test_tokenizer_matches_llama2c_encoder(imported, files, stories):
    _, tok = imported
    samples = stories[:30] + ["naïve café — 日本語 🙂", "  two  spaces\nand a newline", ""]
    for text in samples:
        assert tok(text).input_ids == llama2c_encode(text, files[1])
        assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text


def test_loss_on_tinystories(imported, stories):
    """The data README's ~1.27 nats/token holds on the first stories (1.265 measured on the
    first 20); over the whole sample it is higher (~1.46), see the README."""
    model, tok = imported
    total, count = 0.0, 0
    for story in stories[:20]:
        ids = torch.tensor([tok(story).input_ids[:512]])
        with torch.no_grad():
            loss = model(ids, labels=ids).loss.item()
        total += loss * (ids.shape[1] - 1)
        count += ids.shape[1] - 1
    assert 1.20 < total / count < 1.33


def test_cli_import_writes_an_auto_loadable_folder(files, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert main(["models", "import-llama2c", str(files[0]), str(files[1]), str(tmp_path)]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    out = model.generate(torch.tensor([[tok.bos_token_id]]), max_new_tokens=40, do_sample=False)
    assert tok.decode(out[0], skip_special_tokens=True).startswith(REFERENCE)


def test_truncated_and_foreign_files_get_clear_errors(files, tmp_path, capsys):
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(files[0].read_bytes()[:50_000])
    with pytest.raises(PlasticError, match="truncated"):
        from_llama2c(truncated, files[1])
    foreign = tmp_path / "foreign.bin"
    foreign.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    with pytest.raises(PlasticError, match="not a llama2.c"):
        from_llama2c(foreign, files[1])
    short_tok = tmp_path / "tok.bin"
    short_tok.write_bytes(files[1].read_bytes()[:3000])
    with pytest.raises(PlasticError, match="truncated"):
        from_llama2c(files[0], short_tok)
    assert main(["models", "import-llama2c", str(truncated), str(files[1]), str(tmp_path / "o")]) == 2
    assert "truncated" in capsys.readouterr().err
