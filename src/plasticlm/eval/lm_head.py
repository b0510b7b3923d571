"""Score where it is scored: the decoder's hidden states, gathered at the positions that are
scored, then the LM head there only, so that no [batch, length, vocabulary] tensor exists.

- :func:`hidden_states` [B, T, H]: the decoder's output (final norm included), the LM head not
  applied (HF's ``logits_to_keep=1`` leaves one position's logits per row).
- :func:`selected_logits` [N, V] float32: the head applied to N gathered hidden states, with the
  config's final logit soft-capping and logit scale when it has them (Llama and Qwen have none).
- :func:`chunked_cross_entropy`: the summed next-token cross-entropy of N hidden states, the
  head applied ``chunk`` rows at a time, each chunk's logits recomputed in the backward pass
  (:func:`torch.utils.checkpoint.checkpoint`) instead of kept. On CUDA, liger-kernel's fused
  linear cross-entropy (https://github.com/linkedin/Liger-Kernel) or Apple's Cut
  Cross-Entropy (arXiv:2411.09009) when installed; the chunked torch path is the fallback and
  the tests' reference.

V is the rows of the output embedding (``config.vocab_size``), never ``len(tokenizer)``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# rows of logits in flight at once: CHUNK x V float32 (about 40 MB at V = 151,936)
CHUNK = 64


def hidden_states(model: nn.Module, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor | None = None,
                  position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The decoder's last hidden states [B, T, H] of ``input_ids`` [B, T].

    The whole model's forward runs (hooks on it fire, a PEFT wrapper's included) with
    ``logits_to_keep=1``, and the decoder's output is read by a forward hook: the head
    computes one position per row, not T.
    """
    kept: list[torch.Tensor] = []

    def keep(_module, _args, out):
        kept.append(out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0])

    handle = model.get_decoder().register_forward_hook(keep)
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
              use_cache=False, logits_to_keep=1)
    finally:
        handle.remove()
    return kept[-1]


def _head(model: nn.Module) -> nn.Module:
    return model.get_output_embeddings()


def _finish(model: nn.Module, logits: torch.Tensor) -> torch.Tensor:
    """Logit scale and final soft-capping, where the config has them, as float32."""
    config = model.config
    logits = logits.float()
    scale = getattr(config, "logit_scale", None)
    if scale:
        logits = logits * scale
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def selected_logits(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Float32 logits [N, V] of ``hidden`` [N, H] (hidden states gathered where scored)."""
    return _finish(model, _head(model)(hidden))


def gather_positions(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``hidden`` [B, T, H] at the True entries of ``mask`` [B, T], row-major: [N, H]."""
    return hidden[mask]


@torch.no_grad()
def token_logprobs(model: nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                   chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of ``targets`` [N], whether each is the argmax [N]) from ``hidden`` [N, H],
    ``chunk`` rows of logits at a time."""
    logp = torch.empty(len(targets), dtype=torch.float32, device=hidden.device)
    greedy = torch.empty(len(targets), dtype=torch.bool, device=hidden.device)
    for s in range(0, len(targets), chunk):
        logits = selected_logits(model, hidden[s:s + chunk])
        t = targets[s:s + chunk]
        logp[s:s + chunk] = logits.gather(-1, t[:, None]).squeeze(-1) - logits.logsumexp(-1)
        greedy[s:s + chunk] = logits.argmax(-1) == t
    return logp, greedy


def _ce_sum(model: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(selected_logits(model, hidden), targets, reduction="sum")


def chunked_cross_entropy(model: nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                          chunk: int = CHUNK, fused: bool = True) -> torch.Tensor:
    """Summed cross-entropy (a float32 scalar) of ``targets`` [N] under the logits of
    ``hidden`` [N, H], never holding more than ``chunk`` rows of logits, forward or backward.

    ``fused``: on CUDA, a fused linear cross-entropy when one is installed (and the head has
    no bias and no logit scale); otherwise, and always on the CPU, the chunked torch path.
    """
    if fused and hidden.is_cuda:
        loss = _fused_ce(model, hidden, targets)
        if loss is not None:
            return loss
    needs_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in _head(model).parameters()))
    total = hidden.new_zeros((), dtype=torch.float32)
    for s in range(0, len(targets), chunk):
        h, t = hidden[s:s + chunk], targets[s:s + chunk]
        if needs_grad:
            total = total + checkpoint(functools.partial(_ce_sum, model), h, t,
                                       use_reentrant=False)
        else:
            total = total + _ce_sum(model, h, t)
    return total


@functools.cache
def _fused_kernel():
    """The installed fused linear cross-entropy ``f(hidden, weight, targets, softcap)`` (sum),
    or None: liger-kernel first, then Cut Cross-Entropy (lazy: optional, CUDA only)."""
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError:
        pass
    else:
        def liger(hidden, weight, targets, softcap):
            return liger_fused_linear_cross_entropy(hidden, weight, targets, reduction="sum",
                                                    softcap=softcap)
        return liger
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError:
        return None

    def cce(hidden, weight, targets, softcap):
        return linear_cross_entropy(hidden, weight, targets, reduction="sum", softcap=softcap)
    return cce


def _fused_ce(model: nn.Module, hidden: torch.Tensor, targets: torch.Tensor
              ) -> torch.Tensor | None:
    kernel = _fused_kernel()
    head = _head(model)
    if kernel is None or getattr(head, "bias", None) is not None or \
            getattr(model.config, "logit_scale", None) or not isinstance(head, nn.Linear):
        return None
    softcap = getattr(model.config, "final_logit_softcapping", None) or None
    return kernel(hidden, head.weight, targets, softcap).float()
