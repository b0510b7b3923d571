"""The probe gate: is a fact readable from a transmitter's prompt cache at all?

Before a fuser is trained to carry what a transmitter knows, a linear probe asks whether the
answer is in the cache the fuser would read. Per transmitter layer, the features of a prompt
are its K (RoPE undone) and V at

- ``fused``: the mean over the positions C2C fuses (every prompt token but the BOS and the
  last),
- ``before_last``: the last position C2C fuses, and
- ``last``: the last prompt token (fused only with ``fuse_last``);

a multinomial logistic regression over the answer values is trained on one set of questions
and scored on questions about other entities: the 4-way choice is the option with the
highest probe logit. A transmitter whose probe is no better than a control transmitter's
(same shape, not knowing the facts) has nothing a fuser could carry.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plasticlm.eval import encode_with_bos
from plasticlm.refine.cache import extract_cache
from plasticlm.refine.fusers.align import derotate

POSITIONS = ("fused", "before_last", "last")


@dataclass
class ProbeItem:
    """A prompt, its answer choices and the index of the right one."""

    prompt: str
    choices: tuple[str, ...]
    answer: int


@torch.no_grad()
def cache_features(peer, prompts: list[str]) -> dict[tuple[int, str], torch.Tensor]:
    """{(layer, position): [N, 2 * kv_heads * head_dim]} features of each prompt's cache."""
    layout = peer.layout
    out: dict[tuple[int, str], list[torch.Tensor]] = {}
    for prompt in prompts:
        ids = encode_with_bos(peer.tokenizer, prompt)
        cache, _ = extract_cache(peer.model, torch.tensor([ids]))
        first = 1 if len(ids) > 2 else 0
        for layer in range(cache.num_layers):
            k = derotate(cache.keys[layer].float(), layout.inv_freq, cache.positions,
                         layout.rope_scaling)[0]
            v = cache.values[layer].float()[0]
            kv = torch.cat([k, v], dim=0).permute(1, 0, 2).reshape(k.shape[1], -1)  # [T, 2*KV*D]
            out.setdefault((layer, "fused"), []).append(kv[first:-1].mean(0) if len(ids) > 1
                                                        else kv[0])
            out.setdefault((layer, "before_last"), []).append(kv[max(len(ids) - 2, 0)])
            out.setdefault((layer, "last"), []).append(kv[-1])
    # the probes are small models trained on the CPU
    return {key: torch.stack(rows).cpu() for key, rows in out.items()}


def probe_choice_accuracy(train_x: torch.Tensor, train_items: list[ProbeItem],
                          test_x: torch.Tensor, test_items: list[ProbeItem], steps: int = 300,
                          weight_decay: float = 1e-2, seed: int = 0) -> list[float]:
    """Train a linear probe (answer value classes) on ``train_x`` [N, F]; per test item, 1.0
    when the right option has the highest logit among its choices (options never seen as an
    answer in training score lowest), else 0.0."""
    classes = sorted({it.choices[it.answer] for it in train_items})
    index = {c: i for i, c in enumerate(classes)}
    y = torch.tensor([index[it.choices[it.answer]] for it in train_items])
    mean, std = train_x.mean(0), train_x.std(0) + 1e-6
    xs, xt = (train_x - mean) / std, (test_x - mean) / std
    torch.manual_seed(seed)
    probe = torch.nn.Linear(xs.shape[1], len(classes))
    opt = torch.optim.AdamW(probe.parameters(), lr=1e-2, weight_decay=weight_decay)
    with torch.enable_grad():
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(probe(xs), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        logits = probe(xt)
    scores = []
    for row, it in zip(logits, test_items):
        option = [float(row[index[c]]) if c in index else float("-inf") for c in it.choices]
        scores.append(float(max(range(len(option)), key=option.__getitem__) == it.answer))
    return scores


def probe_table(peer, train_items: list[ProbeItem], test_items: list[ProbeItem],
                seed: int = 0) -> dict[tuple[int, str], list[float]]:
    """{(layer, position): per-test-item probe scores} for every layer and position."""
    train = cache_features(peer, [it.prompt for it in train_items])
    test = cache_features(peer, [it.prompt for it in test_items])
    return {key: probe_choice_accuracy(train[key], train_items, test[key], test_items, seed=seed)
            for key in train}
