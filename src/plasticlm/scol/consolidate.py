"""Adaptation and commit: LoRA on chosen layers learns a context, then merges into float32.

Each candidate is adapted on its own copy of the running model; the winner's merged copy
becomes the running model and the others are dropped. Copies avoid two PEFT pitfalls: a
model merged in place that later ignores a new adapter on the same layer, and small deltas
rounded away in low precision (the running model is kept in float32).
"""

from __future__ import annotations

import copy
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model

from plasticlm.config import Field, configclass
from plasticlm.errors import PlasticError
from plasticlm.eval.lm_head import chunked_cross_entropy, hidden_states

# The inner update's defaults come from `plasticlm scol experiment sweep` on the sandbox v2
# receiver (bench/results/scol_sweep_v2_mlp.md): the best acquisition among the settings
# that keep >= 90% of the untouched model's legal-answer rate after a 24-context stream. A
# single-layer update of the attention projections writes almost nothing a question can read
# (bench/results/scol_depth.md); one of the MLP does (lr 3e-3, 30 steps), and without generic
# replay a stream of such updates breaks the model (legal answers 58% -> 0-18% at lr >= 3e-3).
# The projections a LoRA update can target (names of Llama/Qwen2/Qwen3 modules), by unit.
Projection = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj"]
MODULES = {"attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
           "mlp": ("gate_proj", "up_proj", "down_proj"),
           "all": get_args(Projection)}
Unit = Literal[tuple(MODULES)]     # a key of MODULES, as a config choice
DEFAULT_TARGETS = MODULES["mlp"]


@configclass
class LoraTrainConfig:
    """LoRA adaptation of one context: rank, scale, optimiser and steps."""

    rank: int = Field(8, ge=1, description="LoRA rank")
    alpha: float = Field(16.0, gt=0, description="LoRA scale numerator (scale = alpha / rank)")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate of the inner update")
    steps: int = Field(12, ge=1, description="optimiser steps per context")
    target_modules: tuple[Projection, ...] = Field(
        DEFAULT_TARGETS, min_length=1, description="projections LoRA adapts in each chosen "
        "layer")
    max_tokens: int = Field(256, ge=2, description="longer contexts are cut into windows of "
                            "this many tokens")
    grad_clip: float = Field(1.0, gt=0, description="gradient-norm clip of each step")
    replay: int = Field(4, ge=0, description="windows of generic text trained beside each "
                        "context (0: none; where the data has no generic corpus, as with a "
                        "real SQuAD file, there is nothing to replay)")


def num_layers_of(model) -> int:
    return int(model.config.num_hidden_layers)


def float32_master(model):
    """The model in float32 (a no-op when it already is): merges keep small deltas."""
    if next(model.parameters()).dtype != torch.float32:
        model = model.float()
    return model


def context_windows(tokenizer, text: str, max_tokens: int) -> torch.Tensor:
    """``[bos] + tokens + [eos]`` of ``text`` cut into rows of at most ``max_tokens``,
    right-padded with -100 labels: returns ids [N, T] (padding = EOS id) and labels [N, T]."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id, *ids]
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    if len(ids) < 2:
        raise PlasticError("the context encodes to fewer than 2 tokens; nothing to learn")
    rows = [ids[i: i + max_tokens] for i in range(0, len(ids) - 1, max_tokens - 1)]
    rows = [r for r in rows if len(r) >= 2]
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad_of(tokenizer), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
        labels[i, : len(r)] = torch.tensor(r)
    return torch.stack([out, labels])


def pad_of(tokenizer) -> int:
    """The id that pads context windows (EOS, as :func:`context_windows` pads)."""
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0


def stack_windows(windows: list[torch.Tensor], pad: int) -> torch.Tensor:
    """Several ``context_windows`` results as one [2, N, T] (right-padded to the widest)."""
    width = max(w.shape[-1] for w in windows)
    out = []
    for w in windows:
        extra = width - w.shape[-1]
        out.append(torch.stack([F.pad(w[0], (0, extra), value=pad),
                                F.pad(w[1], (0, extra), value=-100)]))
    return torch.cat(out, dim=1)


def with_replay(windows: torch.Tensor, pool: torch.Tensor | None, n: int, pad: int,
                seed: int) -> torch.Tensor:
    """``windows`` plus ``n`` rows of generic text drawn from ``pool`` by ``seed`` (the
    rows the update replays so that learning a context does not unlearn the language)."""
    if n <= 0 or pool is None or pool.shape[1] == 0:
        return windows
    gen = torch.Generator().manual_seed(seed)
    rows = pool[:, torch.randperm(pool.shape[1], generator=gen)[:n]]
    return stack_windows([windows, rows], pad)


def lm_loss(model, windows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy on ``windows`` = stack(ids [N, T], labels [N, T])."""
    ids, labels = windows[0], windows[1]
    device = next(model.parameters()).device
    # the LM head only at labelled positions, in chunks: never [N, T, V] logits
    hidden = hidden_states(model, ids.to(device))[:, :-1]           # [N, T-1, H]
    targets = labels[:, 1:].to(device)
    scored = targets != -100
    return chunked_cross_entropy(model, hidden[scored], targets[scored]) / \
        scored.sum().clamp(min=1)


def adapt_lora(model, layers, windows: torch.Tensor, cfg: LoraTrainConfig, seed: int = 0,
               rows_per_step: int | None = None):
    """A copy of ``model`` with LoRA on ``layers`` trained on ``windows`` and merged in.

    Each step uses every window, or ``rows_per_step`` random ones. ``model`` is untouched. Returns ``(merged_model, losses)``; only the chosen layers'
    target weights differ from ``model``'s.
    """
    layers = sorted({int(i) for i in layers})
    n = num_layers_of(model)
    if not layers or layers[0] < 0 or layers[-1] >= n:
        raise PlasticError(f"layers {layers} are not a non-empty subset of 0..{n - 1}")
    torch.manual_seed(seed)
    work = copy.deepcopy(model)
    peft_cfg = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=0.0,
                          target_modules=list(cfg.target_modules), layers_to_transform=layers,
                          layers_pattern="layers", bias="none")
    peft_model = get_peft_model(work, peft_cfg)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    peft_model.train()
    losses = []
    gen = torch.Generator().manual_seed(seed)
    for _ in range(cfg.steps):
        batch = windows
        if rows_per_step is not None and rows_per_step < windows.shape[1]:
            batch = windows[:, torch.randperm(windows.shape[1], generator=gen)[:rows_per_step]]
        loss = lm_loss(peft_model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        losses.append(loss.item())
    # The return value is the merged model; the wrapper must not be reused afterwards.
    merged = peft_model.merge_and_unload()
    merged.eval()
    for p in merged.parameters():
        p.requires_grad_(True)
    return merged, losses


def layer_change(before, after) -> dict[int, float]:
    """Per layer index: the L2 norm of the weight change between two models of one shape."""
    a, b = dict(before.named_parameters()), dict(after.named_parameters())
    out: dict[int, float] = {}
    for name, p in a.items():
        parts = name.split(".")
        if "layers" not in parts:
            continue
        idx = int(parts[parts.index("layers") + 1])
        d = float((b[name].detach() - p.detach()).double().norm())
        out[idx] = out.get(idx, 0.0) + d * d
    return {k: v ** 0.5 for k, v in sorted(out.items())}


def changed_parameters(before, after) -> list[str]:
    """Names of parameters that differ at all (exact comparison)."""
    b = dict(after.named_parameters())
    return [n for n, p in before.named_parameters() if not torch.equal(p.detach(), b[n].detach())]
