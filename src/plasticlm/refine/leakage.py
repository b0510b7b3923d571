"""How much of a prompt an attacker recovers from a shared KV cache.

Threat model: the attacker holds the transmitter's weights and sees the cache on the wire
(only the layers the fuser reads). Two attacks:

- :func:`learned_inversion`, against every layer: a decoder (linear, or an MLP) trained on
  the caches of *public* texts to name the token at each position from that position's
  (de-rotated) K and V; applied to the caches of the private prompts.
- :func:`measure_leakage`: nearest-neighbour inversion of the earliest
  shared layer. For every vocabulary token the attacker computes that layer's (de-rotated) key
and value of the token right after BOS, then labels each shared position with the token
whose features are closest in cosine. At layer 0 a token's K and V depend on the token
alone, so the inversion of an un-rephrased prompt is exact; rephrasing is what hides words.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from plasticlm.eval import encode_with_bos
from plasticlm.refine.cache import KVCache, extract_cache
from plasticlm.refine.fusers.align import derotate


def _features(cache: KVCache, layer: int) -> torch.Tensor:
    """Per position, concat(de-rotated K, V) of ``layer``, L2-normalised: [B, T, 2*H*D]."""
    k = derotate(cache.keys[layer].float(), cache.layout.inv_freq, cache.positions,
                 cache.layout.rope_scaling)
    v = cache.values[layer].float()
    b, _, t, _ = k.shape
    x = torch.cat([k, v], dim=1).permute(0, 2, 1, 3).reshape(b, t, -1)
    return torch.nn.functional.normalize(x, dim=-1)


@torch.no_grad()
def vocabulary_table(model, tokenizer, layer: int, batch_size: int = 256) -> torch.Tensor:
    """The attacker's table: features of every token id at position 1 after BOS, [V, F]."""
    bos = tokenizer.bos_token_id
    vocab = model.get_input_embeddings().weight.shape[0]
    rows = []
    for start in range(0, vocab, batch_size):
        ids = torch.arange(start, min(vocab, start + batch_size))[:, None]
        seq = torch.cat([torch.full_like(ids, bos), ids], 1) if bos is not None else ids
        cache, _ = extract_cache(model, seq)
        rows.append(_features(cache, layer)[:, -1])
    return torch.cat(rows)


@torch.no_grad()
def invert_cache(cache: KVCache, table: torch.Tensor, layer: int, skip: int = 1
                 ) -> list[list[int]]:
    """Recovered token ids per real position of each row (the first ``skip``, BOS, dropped)."""
    feats = _features(cache, layer)
    best = (feats @ table.to(feats.device).T).argmax(-1)
    out = []
    for row in range(best.shape[0]):
        real = cache.mask[row].bool().tolist()
        out.append([int(t) for t, keep in zip(best[row].tolist(), real) if keep][skip:])
    return out


def token_recall(original: list[int], recovered: list[int]) -> float:
    """Share of the original tokens (as a multiset) present among the recovered ones."""
    if not original:
        return 0.0
    hit = Counter(original) & Counter(recovered)
    return sum(hit.values()) / len(original)


@dataclass
class LeakageResult:
    """Mean token recall of original prompts from caches of raw and of rephrased prompts."""

    layer: int
    raw_recall: float
    rephrased_recall: float
    raw_exact: float              # share of prompts recovered token for token
    n: int


@torch.no_grad()
def measure_leakage(model, tokenizer, prompts: list[str], rephrased: list[str], layer: int = 0
                    ) -> LeakageResult:
    """Attack the transmitter's caches of ``prompts`` and of their ``rephrased`` versions;
    recall is always measured against the original prompt's tokens."""
    table = vocabulary_table(model, tokenizer, layer)
    skip = 1 if tokenizer.bos_token_id is not None else 0
    raw, reph, exact = [], [], []
    for p, r in zip(prompts, rephrased, strict=True):
        orig = encode_with_bos(tokenizer, p)[skip:]
        for text, sink in ((p, raw), (r, reph)):
            ids = encode_with_bos(tokenizer, text)
            cache, _ = extract_cache(model, torch.tensor([ids]))
            got = invert_cache(cache, table, layer, skip)[0]
            sink.append(token_recall(orig, got))
            if text is p:
                exact.append(float(got == orig))
    n = len(prompts)
    return LeakageResult(layer, sum(raw) / n, sum(reph) / n, sum(exact) / n, n)


def _raw_features(cache: KVCache, layer: int) -> torch.Tensor:
    """concat(de-rotated K, V) of ``layer`` at every real position, [N, 2*H*D]."""
    k = derotate(cache.keys[layer].float(), cache.layout.inv_freq, cache.positions,
                 cache.layout.rope_scaling)
    x = torch.cat([k, cache.values[layer].float()], dim=1)
    b, _, t, _ = x.shape
    # on the CPU, where the attacker's small decoders train
    return x.permute(0, 2, 1, 3).reshape(b, t, -1)[cache.mask.bool()].cpu()


@dataclass
class InversionResult:
    """A learned decoder's token recall at one layer: of the original prompts from their own
    caches (``raw_recall``, and ``raw_position_accuracy``: the right token at the right
    position) and from the caches of their rephrasings (``rephrased_recall``)."""

    layer: int
    raw_recall: float
    raw_position_accuracy: float
    rephrased_recall: float
    n: int


def learned_inversion(model, tokenizer, public_texts: list[str], prompts: list[str],
                      rephrased: list[str], layers: list[int] | None = None, hidden: int = 0,
                      steps: int = 400, batch_size: int = 1024, lr: float = 3e-3,
                      max_tokens: int = 96, seed: int = 0) -> list[InversionResult]:
    """Train, per layer, a decoder from a position's K/V features to its token on the caches
    of ``public_texts`` (the attacker's data: never the prompts), then attack the caches of
    ``prompts`` and of ``rephrased`` (same order). ``hidden`` > 0: an MLP decoder with one
    hidden layer of that width, else linear. Recall is always against the original prompt's
    tokens (BOS excluded). Returns one result per layer (all layers by default)."""
    skip = 1 if tokenizer.bos_token_id is not None else 0
    vocab = model.get_input_embeddings().weight.shape[0]
    layers = list(range(model.config.num_hidden_layers)) if layers is None else layers

    def caches(texts: list[str]) -> list[tuple[KVCache, list[int]]]:
        out = []
        for text in texts:
            ids = encode_with_bos(tokenizer, text)[:max_tokens]
            with torch.no_grad():
                out.append((extract_cache(model, torch.tensor([ids]))[0], ids))
        return out

    public, raw, reph = caches(public_texts), caches(prompts), caches(rephrased)
    results = []
    for layer in layers:
        x = torch.cat([_raw_features(c, layer)[skip:] for c, _ in public])
        y = torch.cat([torch.tensor(ids[skip:]) for _, ids in public])
        mean, std = x.mean(0), x.std(0) + 1e-6
        torch.manual_seed(seed)
        dim = x.shape[1]
        decoder = (torch.nn.Linear(dim, vocab) if hidden <= 0 else torch.nn.Sequential(
            torch.nn.Linear(dim, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, vocab)))
        opt = torch.optim.AdamW(decoder.parameters(), lr=lr, weight_decay=1e-4)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            rows = torch.randint(0, len(y), (min(batch_size, len(y)),), generator=gen)
            loss = torch.nn.functional.cross_entropy(decoder((x[rows] - mean) / std), y[rows])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        raw_recall, position, reph_recall = [], [], []
        with torch.no_grad():
            for (c, ids), (c_r, _) in zip(raw, reph, strict=True):
                orig = ids[skip:]
                got, got_r = (decoder((_raw_features(x, layer)[skip:] - mean) / std)
                              .argmax(-1).tolist() for x in (c, c_r))
                raw_recall.append(token_recall(orig, got))
                position.append(sum(a == b for a, b in zip(orig, got)) / max(1, len(orig)))
                reph_recall.append(token_recall(orig, got_r))
        n = len(raw)
        results.append(InversionResult(layer, sum(raw_recall) / n, sum(position) / n,
                                       sum(reph_recall) / n, n))
    return results
