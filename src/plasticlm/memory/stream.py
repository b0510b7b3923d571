"""O(1)-memory streaming inference: per layer a KV cache capped at W-1 tokens plus the memory state.

Every layer streams with windowed attention (layers without a memory branch too), so what
the stream holds does not grow with the number of tokens consumed; RoPE positions keep
growing with the absolute position. Feeding a sequence chunk by chunk gives the logits of
the parallel windowed forward of the same model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from plasticlm.errors import PlasticError
from plasticlm.memory.adapter import attach_memory, memory_config
from plasticlm.memory.layer import LayerStreamState
from plasticlm.tensor_files import load_tensors


class MemoryStream:
    """Consume a token stream chunk by chunk (prefill and generation) in constant memory.

    ``model`` is a memory-attached model, or a plain Llama/Qwen2/Qwen3 one, which then gets
    windowed attention only (``attach_memory(model, layers=[], window=window)``).

    >>> stream = MemoryStream(model)                       # doctest: +SKIP
    >>> logits = stream.feed(prompt_ids)                   # [B, T, V]
    >>> new_ids = stream.generate(20)                      # [B, 20], greedy
    """

    def __init__(self, model: nn.Module, window: int | None = None, chunk_tokens: int = 512):
        config = memory_config(model)
        if config is None:
            if window is None:
                raise PlasticError("a model without memory needs window=W to stream with a capped cache")
            attach_memory(model, layers=[], window=window)
            config = memory_config(model)
        elif window is not None and window != config.window:
            raise PlasticError(
                f"the model's memory was attached with window={config.window}; stream with that window "
                "(omit window=) or attach again with the window you want")
        if chunk_tokens < 1:
            raise PlasticError(f"chunk_tokens must be >= 1; got {chunk_tokens}")
        self.model = model
        self.window = config.window
        self.chunk_tokens = chunk_tokens
        self._attn = [layer.self_attn for layer in model.get_decoder().layers]
        self.reset()

    def reset(self) -> None:
        """Forget everything: empty caches and memories, position 0."""
        self.states = [LayerStreamState() for _ in self._attn]
        self.position = 0
        self.last_logits: torch.Tensor | None = None

    def feed(self, input_ids: torch.Tensor, keep: str = "all", grad: bool = False) -> torch.Tensor:
        """Consume input_ids [B,T]; returns logits [B,T,V] (``keep="all"``) or [B,1,V] ("last").

        With ``grad`` the forward is recorded for autograd, through the state carried in from
        earlier feeds; :meth:`detach` cuts that history (truncated BPTT)."""
        if keep not in ("all", "last"):
            raise PlasticError(f"keep must be 'all' or 'last'; got {keep!r}")
        if input_ids.dim() != 2:
            raise PlasticError(f"input_ids must be [B, T]; got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] == 0:
            raise PlasticError("feed() got no tokens")
        device = next(self.model.parameters()).device
        input_ids = input_ids.to(device)
        outs = []
        try:
            for attn, state in zip(self._attn, self.states):
                attn.stream_state = state
            with torch.set_grad_enabled(grad):
                for start in range(0, input_ids.shape[1], self.chunk_tokens):
                    chunk = input_ids[:, start:start + self.chunk_tokens]
                    positions = torch.arange(self.position, self.position + chunk.shape[1],
                                             device=device)[None]
                    logits = self.model(input_ids=chunk, position_ids=positions,
                                        use_cache=False).logits
                    self.position += chunk.shape[1]
                    # clone: a slice would keep the whole chunk's logits alive
                    self.last_logits = logits[:, -1:].clone()
                    if keep == "all":
                        outs.append(logits)
        finally:
            for attn in self._attn:
                attn.stream_state = None
        return torch.cat(outs, dim=1) if keep == "all" else self.last_logits

    def detach(self) -> None:
        """Keep the state's values but cut its autograd history: what is fed next with
        ``grad=True`` sends no gradient into the tokens already fed (truncated BPTT)."""
        for state in self.states:
            for name, tensor in state.tensors().items():
                setattr(state, name, tensor.detach())
        if self.last_logits is not None:
            self.last_logits = self.last_logits.detach()

    @torch.no_grad()
    def generate(self, max_new_tokens: int) -> torch.Tensor:
        """Greedy continuation after what was fed: new token ids [B, max_new_tokens]."""
        if self.last_logits is None:
            raise PlasticError("feed() a prompt before generate()")
        new = []
        for _ in range(max_new_tokens):
            token = self.last_logits[:, -1].argmax(-1, keepdim=True)
            new.append(token)
            self.feed(token, keep="last")
        return torch.cat(new, dim=1)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything the stream carries, as tensors (``position`` included)."""
        out = {"position": torch.tensor([self.position], dtype=torch.int64)}
        for i, state in enumerate(self.states):
            for name, tensor in state.tensors().items():
                out[f"layers.{i}.{name}"] = tensor
        if self.last_logits is not None:
            out["last_logits"] = self.last_logits
        return out

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`state_dict` gave (onto the model's device)."""
        if "position" not in tensors:
            raise PlasticError("not a stream state: no 'position' entry")
        device = next(self.model.parameters()).device
        self.reset()
        self.position = int(tensors["position"][0])
        self.last_logits = tensors["last_logits"].to(device) if "last_logits" in tensors else None
        for key, tensor in tensors.items():
            if key.startswith("layers."):
                _, i, name = key.split(".", 2)
                if int(i) >= len(self.states) or not hasattr(self.states[int(i)], name):
                    raise PlasticError(f"stream state entry {key!r} does not fit this model")
                setattr(self.states[int(i)], name, tensor.to(device))

    def save(self, path: str | Path) -> Path:
        """Write the stream state to a safetensors file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, str(path))
        return path

    def load(self, path: str | Path) -> None:
        """Read a state written by :meth:`save`."""
        if not Path(path).exists():
            raise PlasticError(f"stream state {path} does not exist")
        self.load_state_dict(load_tensors(path, "memory stream state"))

    def state_bytes(self) -> int:
        """Bytes the stream carries now (caches + memories); bounded by the window."""
        return sum(t.numel() * t.element_size() for t in self.state_dict().values())
