"""Import karpathy's llama2.c "v0" checkpoints as a Hugging Face Llama and fast tokenizer.

The model file is 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
seq_len) then float32 weights; a negative vocab_size means an untied output layer stored
last. llama2.c rotates adjacent pairs of q/k dimensions while Hugging Face Llama rotates
halves, so the q/k rows are permuted on import. The tokenizer file is an int32
max_token_length then, per token, float32 score, int32 length, bytes; it becomes a
byte-fallback BPE whose merges are ranked by the merged token's score, which reproduces
llama2.c's "merge the best-scoring adjacent pair" encoder.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from plasticlm.errors import PlasticError

HEADER = struct.Struct("<7i")
SPACE = "\u2581"  # sentencepiece's visible space, as Hugging Face Llama tokenizers use


def _read_header(path: Path) -> tuple[int, ...]:
    if not path.is_file():
        raise PlasticError(f"llama2.c model file {path} does not exist or is not a file")
    with path.open("rb") as f:
        raw = f.read(HEADER.size)
    if len(raw) < HEADER.size:
        raise PlasticError(f"{path} is too short to be a llama2.c checkpoint (no 28-byte header)")
    dims = HEADER.unpack(raw)
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = dims
    sane = (dim > 0 and hidden > 0 and 0 < n_layers < 1024 and 0 < n_heads <= dim
            and 0 < n_kv <= n_heads and n_heads % n_kv == 0 and dim % n_heads == 0
            and (dim // n_heads) % 2 == 0   # RoPE turns pairs of a head's dimensions
            and 0 < abs(vocab) < 10_000_000 and 0 < seq_len < 10_000_000)
    if not sane:
        raise PlasticError(
            f"{path} is not a llama2.c v0 checkpoint: its header reads {dims}, which are not "
            "sane (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len)"
        )
    return dims


def _permute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a q/k projection from interleaved-pair RoPE to rotate-half RoPE."""
    out, inp = w.shape
    return w.view(n_heads, out // n_heads // 2, 2, inp).transpose(1, 2).reshape(out, inp)


def load_llama2c_model(model_bin: str | Path):
    """Read a llama2.c v0 checkpoint into a ``LlamaForCausalLM`` (float32, eval mode)."""
    path = Path(model_bin)
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = _read_header(path)
    shared = vocab > 0
    vocab = abs(vocab)
    hs = dim // n_heads
    shapes = {
        "tok_emb": (vocab, dim), "rms_att": (n_layers, dim), "wq": (n_layers, n_heads * hs, dim),
        "wk": (n_layers, n_kv * hs, dim), "wv": (n_layers, n_kv * hs, dim),
        "wo": (n_layers, dim, n_heads * hs), "rms_ffn": (n_layers, dim),
        "w1": (n_layers, hidden, dim), "w2": (n_layers, dim, hidden), "w3": (n_layers, hidden, dim),
        "rms_final": (dim,), "freq_real": (seq_len, hs // 2), "freq_imag": (seq_len, hs // 2),
    }
    if not shared:
        shapes["wcls"] = (vocab, dim)
    # exact integers: the header's sizes multiplied may pass int64 and wrap around
    expected = sum(math.prod(s) for s in shapes.values())
    data = np.fromfile(path, dtype="<f4", offset=HEADER.size)
    if data.size != expected:
        raise PlasticError(
            f"{path}: the header promises {expected:,} float32 weights but the file holds "
            f"{data.size:,}; the file is truncated or not a llama2.c v0 export"
        )
    tensors, offset = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        tensors[name] = torch.from_numpy(data[offset : offset + n].copy()).view(shape)
        offset += n
    if not all(torch.isfinite(t).all() for t in tensors.values()):
        raise PlasticError(f"{path}: weights contain NaN or infinity; the file is corrupt")

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=dim, intermediate_size=hidden, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=n_kv, head_dim=hs,
        max_position_embeddings=seq_len, rms_norm_eps=1e-5, tie_word_embeddings=shared,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    state = {"model.embed_tokens.weight": tensors["tok_emb"],
             "model.norm.weight": tensors["rms_final"]}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = tensors["rms_att"][i]
        state[p + "post_attention_layernorm.weight"] = tensors["rms_ffn"][i]
        state[p + "self_attn.q_proj.weight"] = _permute_rotary(tensors["wq"][i], n_heads)
        state[p + "self_attn.k_proj.weight"] = _permute_rotary(tensors["wk"][i], n_kv)
        state[p + "self_attn.v_proj.weight"] = tensors["wv"][i]
        state[p + "self_attn.o_proj.weight"] = tensors["wo"][i]
        state[p + "mlp.gate_proj.weight"] = tensors["w1"][i]
        state[p + "mlp.down_proj.weight"] = tensors["w2"][i]
        state[p + "mlp.up_proj.weight"] = tensors["w3"][i]
    state["lm_head.weight"] = tensors["tok_emb"] if shared else tensors["wcls"]
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if "rotary" not in k]:
        raise PlasticError(f"{path}: weights do not match the Llama layout ({missing}, {unexpected})")
    if shared:
        model.tie_weights()
    return model.eval()


def read_llama2c_vocab(tokenizer_bin: str | Path, vocab_size: int) -> tuple[list[str], list[float]]:
    """Tokens (as text, bytes decoded leniently) and scores from a llama2.c tokenizer file."""
    path = Path(tokenizer_bin)
    if not path.is_file():
        raise PlasticError(f"llama2.c tokenizer file {path} does not exist or is not a file")
    raw = path.read_bytes()
    pos, tokens, scores = 4, [], []
    try:
        for i in range(vocab_size):
            score, length = struct.unpack_from("<fi", raw, pos)
            pos += 8
            if not 0 < length <= 1024 or pos + length > len(raw):
                raise PlasticError(f"{path}: token {i} has an impossible length {length}")
            tokens.append(raw[pos : pos + length].decode("utf-8", errors="replace"))
            scores.append(score)
            pos += length
    except struct.error:
        raise PlasticError(
            f"{path}: ends after {len(tokens)} tokens but the model has {vocab_size}; "
            "truncated, or the tokenizer of another model"
        ) from None
    if pos != len(raw):
        raise PlasticError(
            f"{path}: {len(raw) - pos} bytes left after {vocab_size} tokens; "
            "this tokenizer belongs to a model with another vocabulary size"
        )
    return tokens, scores


def llama2c_tokenizer(tokenizer_bin: str | Path, vocab_size: int):
    """A Hugging Face fast tokenizer equivalent to llama2.c's encoder and decoder."""
    tokens, scores = read_llama2c_vocab(tokenizer_bin, vocab_size)
    specials = {0: "<unk>", 1: "<s>", 2: "</s>"}
    pieces = [specials.get(i, t.replace(" ", SPACE)) for i, t in enumerate(tokens)]
    vocab, repeated = {}, set()
    for i, p in enumerate(pieces):
        if p in vocab:
            # a piece that occurs twice (no real vocabulary has one): the later id gets a
            # name no text encodes to, so ids stay dense and below vocab_size
            while p in vocab:
                p = f"<repeat-{i}>{p}"
            pieces[i] = p
            repeated.add(i)
        vocab[p] = i
    merges = []
    for i, piece in enumerate(pieces):
        if i in specials or i in repeated or piece.startswith("<0x") or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((scores[i], i, left, right))
    merges.sort(key=lambda m: (-m[0], m[1]))
    bpe = models.BPE(vocab=vocab, merges=[(a, b) for _, _, a, b in merges],
                     unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE),
                                           normalizers.Replace(" ", SPACE)])
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<unk>")


def from_llama2c(model_bin: str | Path, tokenizer_bin: str | Path):
    """``(LlamaForCausalLM, fast tokenizer)`` from llama2.c model and tokenizer files."""
    model = load_llama2c_model(model_bin)
    tokenizer = llama2c_tokenizer(tokenizer_bin, model.config.vocab_size)
    return model, tokenizer


def import_llama2c(model_bin: str | Path, tokenizer_bin: str | Path, out_dir: str | Path) -> Path:
    """Write a folder that ``AutoModelForCausalLM``/``AutoTokenizer.from_pretrained`` load."""
    hf_logging.disable_progress_bar()  # one shard of a 1 MB model needs no bar
    model, tokenizer = from_llama2c(model_bin, tokenizer_bin)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
