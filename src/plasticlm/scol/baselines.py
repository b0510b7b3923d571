"""Baselines on the same streams and budget: context in the prompt, a running summary in
the prompt, batch test-time training on all contexts at once. (Sequential fine-tuning and
SCoL with random layers are selections of :func:`plasticlm.scol.meta.consolidate_stream`.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from plasticlm.eval import generate_texts
from plasticlm.scol.consolidate import (
    LoraTrainConfig,
    adapt_lora,
    context_windows,
    num_layers_of,
    pad_of,
    stack_windows,
)
from plasticlm.scol.contexts import Context


def in_context_prefix(tokenizer, contexts: Sequence[Context], max_tokens: int) -> str:
    """The most recent contexts that fit in ``max_tokens`` tokens, oldest first, as a prompt
    prefix (a context that does not fit whole is dropped with everything before it)."""
    kept: list[str] = []
    used = 0
    for c in reversed(contexts):
        n = len(tokenizer(c.text + "\n", add_special_tokens=False)["input_ids"])
        if used + n > max_tokens:
            break
        kept.append(c.text)
        used += n
    return "".join(t + "\n" for t in reversed(kept))


def summary_prompt(summary: str, context: str) -> str:
    return f"Notes: {summary}\nNew text: {context}\nUpdated notes:"


@torch.no_grad()
def running_summaries(model, tokenizer, contexts: Sequence[Context], max_new_tokens: int = 48
                      ) -> list[str]:
    """The model's notes after each context: it rewrites its notes with each new context
    (greedy, ``max_new_tokens`` at most); entry t is the notes after contexts 0..t."""
    summary, out = "", []
    for c in contexts:
        summary = generate_texts(model, tokenizer, [summary_prompt(summary, c.text)],
                                 max_new_tokens=max_new_tokens, stop=("\nNew text:",))[0].strip()
        out.append(summary)
    return out


def batch_ttt(model, tokenizer, contexts: Sequence[Context], cfg: LoraTrainConfig,
              seed: int = 0):
    """Test-time training on all contexts at once: LoRA on every layer, one run with the
    stream's budget (``cfg.steps`` steps per context, each on one random context, so the
    same updates and tokens as sequential fine-tuning), merged. Returns the model."""
    all_windows = stack_windows([context_windows(tokenizer, c.text, cfg.max_tokens)
                                 for c in contexts], pad_of(tokenizer))
    budget = LoraTrainConfig(**{**cfg.__dict__, "steps": cfg.steps * len(contexts)})
    merged, _ = adapt_lora(model, range(num_layers_of(model)), all_windows, budget, seed,
                           rows_per_step=max(1, all_windows.shape[1] // len(contexts)))
    return merged
