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
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from plasticlm.errors import PlasticError
from plasticlm.memory.config import MemoryConfig
from plasticlm.memory.fla_bridge import HALF_DTYPES
from plasticlm.memory.masks import padded_window_mask, window_attention_mask, window_mask
from plasticlm.memory.ops import delta_rule
from plasticlm.memory.parts import LoRA, ShortConv

__all__ = ["LayerStreamState", "LoRA", "MemoryAttention", "ShortConv", "window_attention_mask"]


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
        # [B, T] bool, True at real tokens, or None: set before every decoder forward from its
        # 2D padding mask (adapter._share_padding_mask); padding is neither attended to nor
        # written into the memory.
        self.token_mask: torch.Tensor | None = None
        # RoPE exactly as the wrapped architecture applies it
        self._rope = sys.modules[type(base).__module__].apply_rotary_pos_emb
        self.register_load_state_dict_pre_hook(MemoryAttention._base_names)  # (module, sd, prefix, ...)
        if not with_memory:
            return
        self.gate_init, self.decay_init = float(config.gate_init), float(config.decay_init)
        self.shared_lora = config.lora_scope == "shared"
        self.mix = config.mix
        hidden = cfg.hidden_size
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        with torch.device("meta"):  # theta is built empty; reset_theta() gives its values
            self.lora_q = LoRA(hidden, h * d, config.rank, config.lora_alpha)
            self.lora_k = LoRA(hidden, kv * d, config.rank, config.lora_alpha)
            self.lora_v = LoRA(hidden, kv * d, config.rank, config.lora_alpha)
            self.beta_proj = nn.Linear(hidden, h)
            self.gate_logit = nn.Parameter(torch.empty(h))
            self.gate_proj = nn.Linear(hidden, h, bias=False) if config.gate == "input" else None
            self.decay_proj = nn.Linear(hidden, h) if config.decay else None
            self.conv = ShortConv((h + 2 * kv) * d, config.conv_size) if config.conv_size > 0 else None
            self.memory_norm = nn.RMSNorm(d, eps=1e-6) if config.memory_norm else None
        base_device = next(base.parameters()).device
        if base_device.type != "meta":  # on a meta base theta waits for reset_theta()
            self.reset_theta(base_device)

    def _base_names(self, state_dict, prefix, *args) -> None:
        """load_state_dict pre-hook: a base checkpoint's ``<prefix>q_proj.weight`` loads into
        ``<prefix>base.q_proj.weight``, so base weights load after attach (meta device)."""
        own = {name.split(".")[0] for name, _ in self.base.named_parameters()}
        for key in [k for k in state_dict if k.startswith(prefix)]:
            if key[len(prefix):].split(".")[0] in own:
                state_dict[prefix + "base." + key[len(prefix):]] = state_dict.pop(key)

    def reset_theta(self, device: torch.device | str | None = None) -> None:
        """(Re)initialise theta in place, as at attach time: LoRA A kaiming-uniform and B zero,
        beta_proj weight N(0, 0.02) and bias 0, gate_logit = gate_init, gate_proj zero,
        decay_proj weight N(0, 0.02) and bias decay_init, conv the identity, norm scale 1.

        Theta not on ``device`` (default: the wrapped attention's device), e.g. still on the
        meta device, is first allocated there. Draws from the global RNG in a fixed
        order, so one seed gives one theta whichever way the model was built.
        """
        if not self.with_memory:
            return
        device = torch.device(device) if device is not None else next(self.base.parameters()).device
        modules = [self.lora_q, self.lora_k, self.lora_v, self.beta_proj, self.gate_proj,
                   self.decay_proj, self.conv, self.memory_norm]
        for module in [m for m in modules if m is not None] + [self]:
            if any(p.device != device for p in module.parameters(recurse=module is not self)):
                module.to_empty(device=device, recurse=module is not self)
        with torch.no_grad():
            for lora in (self.lora_q, self.lora_k, self.lora_v):
                lora.reset_parameters()
            # nn.Linear's own init first: the draws (and so the values) the constructor made
            self.beta_proj.reset_parameters()
            nn.init.normal_(self.beta_proj.weight, std=0.02)
            nn.init.zeros_(self.beta_proj.bias)
            self.gate_logit.fill_(self.gate_init)
            if self.gate_proj is not None:  # zero: an input-dependent gate starts as the per-head one
                self.gate_proj.reset_parameters()
                nn.init.zeros_(self.gate_proj.weight)
            if self.decay_proj is not None:
                self.decay_proj.reset_parameters()
                nn.init.normal_(self.decay_proj.weight, std=0.02)
                nn.init.constant_(self.decay_proj.bias, self.decay_init)
            if self.conv is not None:
                self.conv.reset_parameters()
            if self.memory_norm is not None:
                self.memory_norm.reset_parameters()

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

    def _real_tokens(self, b: int, t: int) -> torch.Tensor | None:
        """The [B, T] token mask of this forward (True = real), or None: no padding."""
        real = self.token_mask
        return real if real is not None and tuple(real.shape) == (b, t) else None

    def _softmax_branch(self, q, k, v) -> torch.Tensor:
        """q [B,H,T,D], k/v [B,KV,T,D] (RoPE applied) -> [B,H,T,D] within the window; padding
        keys are masked from :attr:`token_mask`, whatever the attention backend."""
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
            mask = padded_window_mask(t, self.window, self._real_tokens(q.shape[0], t), q.device)
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
        real = self._real_tokens(*x.shape[:2])
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
        # a half-precision model on CUDA hands the op half inputs, so that fla's kernel can
        # take them (ops.chunkwise_backend); the state stays float32 either way
        io = x.dtype if x.is_cuda and x.dtype in HALF_DTYPES and g is None else torch.float32
        out, final = delta_rule(q_m.to(io), k_m.to(io), v_m.to(io), beta, initial_state=initial,
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
        out = self._softmax_branch(q, k, v)  # the backend's attention_mask is not read
        if self.with_memory:
            mem = self._memory_branch(hidden_states, q_lin, k_lin, v_lin)
            if self.memory_norm is not None:
                mem = self.memory_norm(mem.float()).to(out.dtype)
            alpha = self._alpha_of(hidden_states).to(out.dtype)
            out = out + alpha * (mem - out if self.mix == "convex" else mem)
        out = out.transpose(1, 2).reshape(b, t, -1)
        return base.o_proj(out), None
