"""Memory-augmented attention: windowed softmax attention mixed per head with a delta-rule memory.

One :class:`MemoryAttention` replaces a decoder layer's ``self_attn`` and wraps the original
(frozen) module. The softmax branch is the original attention restricted to a sliding window
of W tokens (query i sees keys i-W+1..i). The memory branch, when present, reads and writes a
delta-rule state whose q/k/v are the frozen projections plus LoRA (before RoPE; Qwen3's
q_norm/k_norm applied), optionally through a short causal convolution, L2-normalised, with
beta = sigmoid(linear(x)) per head. Per head h the outputs mix as

    out_h = attn_h + alpha_h * (mem_h - attn_h),    alpha_h = sigmoid(gate_logit_h)

(``mix="convex"``; ``mix="additive"`` gives attn_h + alpha_h * mem_h, and ``memory_norm``
RMS-normalises mem_h per head first)

and then go through the frozen output projection. gate_logit starts at ``gate_init``
(default -16, alpha = 1.1e-7), so a freshly attached model is the windowed base model up to
~1e-7 relative, yet alpha stays strictly inside (0, 1) and Adam can move it.

Options beyond the per-head gate: ``gate="input"`` makes it input-dependent,
alpha_t,h = sigmoid(w_h . x_t + gate_logit_h) with w starting at zero (the same model at
attach time); ``decay=True`` is the gated delta rule, S <- exp(g_t) S before each write with
g_t,h = logsigmoid(w_h . x_t + b_h), b starting at ``decay_init`` (forget ~1% per token);
``lora_scope="shared"`` puts the LoRA on the q/k/v that both branches read (the attention
then changes too), instead of on the memory's q/k/v alone.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from plasticlm.errors import PlasticError
from plasticlm.memory.ops import delta_rule


@dataclass
class MemoryConfig:
    """What :func:`plasticlm.memory.attach_memory` builds; saved next to theta as JSON."""

    layers: list[int] = field(default_factory=list)  # layers that get a memory branch
    window: int = 256             # softmax attention window (tokens, including the query)
    rank: int = 8                 # LoRA rank of the memory's q/k/v
    lora_alpha: float = 16.0      # LoRA scale = lora_alpha / rank
    conv_size: int = 0            # short causal depthwise convolution on q/k/v; 0 = none
    gate_init: float = -16.0      # initial gate logit; alpha = sigmoid(gate_init)
    chunk_size: int = 64          # delta-rule chunk for sequences longer than it
    # False removes the recurrence (a control): each token writes into an empty state and
    # reads it back, o_t = beta_t (k_t . q_t) v_t, so nothing is remembered across tokens.
    recurrent: bool = True
    # How the memory joins the attention, per head: "convex" attn + alpha (mem - attn), or
    # "additive" attn + alpha * mem (the attention is never scaled down).
    mix: str = "convex"
    # RMS-normalise each head's memory read (learned per-channel scale, part of theta), so
    # its size does not depend on how much the state has accumulated.
    memory_norm: bool = False
    # "head": one gate logit per head; "input": alpha_t,h = sigmoid(w_h . x_t + gate_logit_h)
    gate: str = "head"
    # Gated delta rule: the state decays by exp(g_t) before each write (Gated DeltaNet).
    decay: bool = False
    decay_init: float = 4.6       # decay bias: exp(g) = sigmoid(4.6) = 0.99 at attach time
    # "memory": LoRA on the memory's q/k/v only; "shared": on the q/k/v both branches read
    lora_scope: str = "memory"
    model_type: str = ""          # architecture it was attached to (checked on load)

    def __post_init__(self):
        for name, allowed in (("mix", ("convex", "additive")), ("gate", ("head", "input")),
                              ("lora_scope", ("memory", "shared"))):
            if getattr(self, name) not in allowed:
                raise PlasticError(f"{name} must be one of {allowed}, not {getattr(self, name)!r}")
        if min(self.window, self.rank, self.chunk_size) < 1 or self.conv_size < 0:
            raise PlasticError(f"memory window, rank and chunk_size must be >= 1 and conv_size "
                               f">= 0; got window={self.window}, rank={self.rank}, chunk_size="
                               f"{self.chunk_size}, conv_size={self.conv_size}")


class LoRA(nn.Module):
    """Low-rank update x -> (x A^T) B^T * scale; B starts at zero so the update starts at zero."""

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float):
        super().__init__()
        self.A = nn.Parameter(torch.empty(rank, in_features))
        self.B = nn.Parameter(torch.zeros(out_features, rank))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out], computed in the parameters' dtype."""
        return (F.linear(F.linear(x.to(self.A.dtype), self.A), self.B) * self.scale).to(x.dtype)


class ShortConv(nn.Module):
    """Depthwise causal convolution over time, initialised to the identity (last tap = 1)."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        weight = torch.zeros(channels, kernel)
        weight[:, -1] = 1.0
        self.weight = nn.Parameter(weight)

    def forward(self, x: torch.Tensor, past: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B,T,C], past [B,K-1,C] (zeros if None) -> (y [B,T,C], new past [B,K-1,C])."""
        b, t, c = x.shape
        if past is None:
            past = x.new_zeros(b, self.kernel - 1, c)
        full = torch.cat([past.to(x.dtype), x], dim=1)                       # [B, K-1+T, C]
        y = F.conv1d(full.transpose(1, 2), self.weight.to(x.dtype)[:, None, :], groups=c)
        return y.transpose(1, 2), full[:, full.shape[1] - (self.kernel - 1):]  # len >= K-1 always


@dataclass
class LayerStreamState:
    """One layer's streaming state: a KV cache capped at W-1 tokens plus the memory."""

    keys: torch.Tensor | None = None      # [B, KV, <=W-1, D], RoPE applied
    values: torch.Tensor | None = None    # [B, KV, <=W-1, D]
    memory: torch.Tensor | None = None    # [B, H, D, D] float32
    conv: torch.Tensor | None = None      # [B, K-1, C]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}


def window_mask(q_len: int, k_len: int, window: int, device=None) -> torch.Tensor:
    """Boolean [q_len, k_len] band: query i (the last q_len of k_len positions) sees key j
    iff 0 <= (k_len - q_len + i) - j < window."""
    qi = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    kj = torch.arange(k_len, device=device)[None, :]
    return (qi - kj >= 0) & (qi - kj < window)


def window_attention_mask(seq_len: int, window: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive [1,1,T,T] mask (0 = attend, dtype min = masked) that makes any HF decoder
    attend within a window of ``window`` tokens: the windowed base model, for comparisons."""
    allowed = window_mask(seq_len, seq_len, window)
    mask = torch.zeros(seq_len, seq_len, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


class MemoryAttention(nn.Module):
    """Drop-in ``self_attn``: windowed frozen attention (+ delta-rule memory when ``with_memory``)."""

    def __init__(self, base: nn.Module, config: MemoryConfig, with_memory: bool):
        super().__init__()
        cfg = base.config
        self.base = base
        self.layer_idx = base.layer_idx
        self.window = config.window
        self.chunk_size = config.chunk_size
        self.recurrent = config.recurrent
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = base.head_dim
        self.with_memory = with_memory
        self.stream_state: LayerStreamState | None = None
        # [B, T] bool, True at real tokens: set for each forward from the model's 2D padding
        # mask (see adapter.attach_memory); padding must not write the memory.
        self.token_mask: torch.Tensor | None = None
        # RoPE exactly as the wrapped architecture applies it
        self._rope = sys.modules[type(base).__module__].apply_rotary_pos_emb
        if not with_memory:
            return
        hidden = cfg.hidden_size
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        self.lora_q = LoRA(hidden, h * d, config.rank, config.lora_alpha)
        self.lora_k = LoRA(hidden, kv * d, config.rank, config.lora_alpha)
        self.lora_v = LoRA(hidden, kv * d, config.rank, config.lora_alpha)
        self.beta_proj = nn.Linear(hidden, h)
        nn.init.normal_(self.beta_proj.weight, std=0.02)
        nn.init.zeros_(self.beta_proj.bias)
        self.gate_logit = nn.Parameter(torch.full((h,), float(config.gate_init)))
        # zero weights: an input-dependent gate starts as the per-head one
        self.gate_proj = nn.Linear(hidden, h, bias=False) if config.gate == "input" else None
        if self.gate_proj is not None:
            nn.init.zeros_(self.gate_proj.weight)
        self.decay_proj = nn.Linear(hidden, h) if config.decay else None
        if self.decay_proj is not None:
            nn.init.normal_(self.decay_proj.weight, std=0.02)
            nn.init.constant_(self.decay_proj.bias, config.decay_init)
        self.shared_lora = config.lora_scope == "shared"
        self.conv = ShortConv((h + 2 * kv) * d, config.conv_size) if config.conv_size > 0 else None
        self.mix = config.mix
        self.memory_norm = nn.RMSNorm(d, eps=1e-6) if config.memory_norm else None

    @property
    def alpha(self) -> torch.Tensor:
        """The per-head mixing gate in (0, 1), [H] (for ``gate="input"``: at a zero input)."""
        return torch.sigmoid(self.gate_logit)

    def _alpha_of(self, x: torch.Tensor) -> torch.Tensor:
        """The gate for input x [B,T,hidden], broadcastable to [B,H,T,D]."""
        if self.gate_proj is None:
            return self.alpha[None, :, None, None]
        logits = self.gate_proj(x.to(self.gate_proj.weight.dtype)) + self.gate_logit  # [B,T,H]
        return torch.sigmoid(logits).transpose(1, 2)[..., None]

    def _heads(self, x: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
        b, t, _ = x.shape
        x = x.view(b, t, -1, self.head_dim)
        if norm is not None:
            x = norm(x)
        return x.transpose(1, 2)                                              # [B, heads, T, D]

    def _softmax_branch(self, q, k, v, attention_mask) -> torch.Tensor:
        """q [B,H,T,D], k/v [B,KV,T,D] (RoPE applied) -> [B,H,T,D] within the window."""
        t = q.shape[2]
        state = self.stream_state
        if state is not None:
            if state.keys is not None:
                k = torch.cat([state.keys, k], dim=2)
                v = torch.cat([state.values, v], dim=2)
            start = max(k.shape[2] - (self.window - 1), 0)  # keep the last W-1 tokens
            state.keys, state.values = k[:, :, start:], v[:, :, start:]
            mask = window_mask(t, k.shape[2], self.window, q.device)[None, None]
        else:
            mask = window_mask(t, t, self.window, q.device)[None, None]
            # keep padding from the model's own 4D mask (bool: True = attend; float: 0 = attend)
            if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4 \
                    and attention_mask.shape[-2:] == (t, t):
                allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
                mask = mask & allowed
        dropout = self.base.attention_dropout if self.training else 0.0
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, scale=self.base.scaling,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )

    def _memory_branch(self, x, q_lin, k_lin, v_lin) -> torch.Tensor:
        """Delta-rule read/write over the sequence: [B,H,T,D] in x's dtype."""
        state = self.stream_state
        if self.shared_lora:  # the LoRA is already in q/k/v_lin
            q_m, k_m, v_m = q_lin, k_lin, v_lin
        else:
            q_m, k_m, v_m = q_lin + self.lora_q(x), k_lin + self.lora_k(x), v_lin + self.lora_v(x)
        real = self.token_mask
        if real is not None and tuple(real.shape) != tuple(x.shape[:2]):
            real = None
        if self.conv is not None:
            split = [q_m.shape[-1], k_m.shape[-1], v_m.shape[-1]]
            mixed = torch.cat([q_m, k_m, v_m], dim=-1)
            if real is not None:  # padding enters the convolution as the zeros of no token
                mixed = mixed * real[..., None].to(mixed.dtype)
            mixed, conv_past = self.conv(mixed, state.conv if state is not None else None)
            if state is not None:
                state.conv = conv_past
            q_m, k_m, v_m = mixed.split(split, dim=-1)
        q_m = self._heads(q_m, getattr(self.base, "q_norm", None))
        k_m = self._heads(k_m, getattr(self.base, "k_norm", None))
        v_m = self._heads(v_m, None)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:  # GQA: each kv head serves `groups` consecutive query heads
            k_m = k_m.repeat_interleave(groups, dim=1)
            v_m = v_m.repeat_interleave(groups, dim=1)
        q_m = F.normalize(q_m.float(), dim=-1, eps=1e-6)
        k_m = F.normalize(k_m.float(), dim=-1, eps=1e-6)
        beta = torch.sigmoid(self.beta_proj(x.to(self.beta_proj.weight.dtype)).float()).transpose(1, 2)
        if real is not None:  # beta = 0: a padding position leaves the state unchanged
            beta = beta * real[:, None, :].to(beta.dtype)
        if not self.recurrent:
            out = beta[..., None] * (q_m * k_m).sum(-1, keepdim=True) * v_m.float()
            return out.to(x.dtype)
        g = None
        if self.decay_proj is not None:
            g = F.logsigmoid(self.decay_proj(x.to(self.decay_proj.weight.dtype)).float()).transpose(1, 2)
            if real is not None:  # padding neither writes nor forgets
                g = g * real[:, None, :].to(g.dtype)
        initial = state.memory if state is not None else None
        out, final = delta_rule(q_m, k_m, v_m.float(), beta, initial_state=initial,
                                chunk_size=self.chunk_size, g=g)
        if state is not None:
            state.memory = final
        return out.to(x.dtype)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None,
                past_key_values=None, **kwargs):
        """hidden_states [B,T,hidden] -> ([B,T,hidden], None), like the wrapped attention."""
        cache = cache if cache is not None else past_key_values
        base = self.base
        b, t, _ = hidden_states.shape
        q_lin = base.q_proj(hidden_states)
        k_lin = base.k_proj(hidden_states)
        v_lin = base.v_proj(hidden_states)
        if self.with_memory and self.shared_lora:
            q_lin = q_lin + self.lora_q(hidden_states)
            k_lin = k_lin + self.lora_k(hidden_states)
            v_lin = v_lin + self.lora_v(hidden_states)
        q = self._heads(q_lin, getattr(base, "q_norm", None))
        k = self._heads(k_lin, getattr(base, "k_norm", None))
        v = self._heads(v_lin, None)
        cos, sin = position_embeddings
        q, k = self._rope(q, k, cos, sin)
        if cache is not None and self.stream_state is None:
            # HF caches grow without bound and cannot carry the memory: allow only a
            # one-shot forward (which fills the cache as usual), never an incremental step.
            if cache.get_seq_length(self.layer_idx) > 0:
                raise PlasticError(
                    "incremental decoding with a Hugging Face cache is not supported on a "
                    "memory-attached model; use plasticlm.memory.MemoryStream (or use_cache=False)")
            cache.update(k, v, self.layer_idx)
        out = self._softmax_branch(q, k, v, attention_mask)
        if self.with_memory:
            mem = self._memory_branch(hidden_states, q_lin, k_lin, v_lin)
            if self.memory_norm is not None:
                mem = self.memory_norm(mem.float()).to(out.dtype)
            alpha = self._alpha_of(hidden_states).to(out.dtype)
            out = out + alpha * (mem - out if self.mix == "convex" else mem)
        out = out.transpose(1, 2).reshape(b, t, -1)
        return base.o_proj(out), None
