"""FedRefine on real shapes: a Qwen receiver and a Llama transmitter (and the reverse, with
Qwen2.5), KV layouts of the published configurations, logits far wider than the tokenizer.
Both sides carry the same small tokenizer, so the token alignment is one to one."""

import math

import pytest
import torch

from plasticlm.refine import Example, FedRefine, FuserTrainConfig, Link, Peer, train_fuser

# (receiver, transmitter, dtype of both models): bfloat16 on one pair, the path is the same
PAIRS = [("qwen3-0.6b", "llama-3.2-1b", "float32"), ("llama-3.2-1b", "qwen2.5-0.5b", "float32"),
         ("qwen2.5-0.5b", "qwen3-0.6b", "bfloat16")]
EXAMPLES = [Example("Q: Who makes it? A:", " Orvane Labs"),
            Example("Q: What is it for? A:", " glaucoma")]


@pytest.mark.parametrize(("receiver_shape", "transmitter_shape", "dtype"), PAIRS,
                         ids=[f"{r}<-{t}-{d}" for r, t, d in PAIRS])
def test_fuser_step_then_c2c_answer(receiver_shape, transmitter_shape, dtype, shape_model,
                                    monkeypatch):
    """One C2C fuser training step (both models frozen, batch of two examples), then one
    c2c answer: choice scores over the full logits and a greedy continuation whose ids the
    receiver's tokenizer all decodes."""
    receiver = Peer("receiver", *shape_model(receiver_shape, dtype=dtype))
    transmitter = Peer("transmitter", *shape_model(transmitter_shape, dtype=dtype))
    cfg = FuserTrainConfig(kind="c2c", hidden=32, epochs=1, batch_size=len(EXAMPLES),
                           dropout=0.0)
    fuser, losses = train_fuser(receiver, transmitter, EXAMPLES, cfg, progress=False)
    assert len(losses) == 1 and math.isfinite(losses[0])
    assert any(p.abs().sum() > 0 for n, p in fuser.named_parameters()
               if n.endswith(("out.weight", "up.weight")))   # zero at init: the step moved it
    fr = FedRefine(receiver, [Link(transmitter, fuser)])
    scored = fr.score(EXAMPLES[0].prompt, ["Orvane Labs", "Keltis Pharma"], "c2c")
    assert len(scored.scores) == 2 and all(math.isfinite(s) and s < 0 for s in scored.scores)
    decoded: list[int] = []
    decode = receiver.tokenizer.decode

    def spy(ids, *args, **kwargs):
        decoded.extend(ids.tolist() if isinstance(ids, torch.Tensor) else ids)
        return decode(ids, *args, **kwargs)
    monkeypatch.setattr(receiver.tokenizer, "decode", spy)
    answer = fr.ask(EXAMPLES[0].prompt, "c2c", max_new_tokens=4, stop=())
    assert isinstance(answer.text, str) and answer.wire_bytes > 0
    assert max(decoded, default=0) < len(receiver.tokenizer)


@pytest.mark.parametrize("shape", ["qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b"])
def test_bytes_per_transmitted_token_at_the_published_depth(shape, shape_model):
    """What a transmitted token costs on the wire, as the codec sends it (the shape bench's
    numbers): layers x kv heads x head dim x 2 (K, V) x bytes per value, plus the payload's
    small fixed part, scaled from the cut model's depth to the published one."""
    from plasticlm.experiments.bench.shapes import shape_layers, wire_per_token
    from plasticlm.models.shapes import SHAPES

    model, tok = shape_model(shape)
    cfg = SHAPES[shape]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_layer = 2 * cfg["num_key_value_heads"] * head_dim     # K and V values a token
    w = wire_per_token(Peer("t", model, tok), " ".join(["the lantern by the river"] * 40),
                       shape_layers(shape))
    for quant, size in (("float32", 4), ("bf16", 2), ("int8", 1)):
        exact = per_layer * size * w["full_layers"]
        assert exact <= w["quant"][quant]["at_full_depth"] < 1.1 * exact, quant
