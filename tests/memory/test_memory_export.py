"""Results that load outside plasticlm (issue 58, item 4): a LoRA-FedAvg adapter trained on a
windowed model loads with PEFT on a plain model and changes its logits exactly as the trained
model; a windowed full-FedAvg model reloads with transformers; a memory-attached model's own
``save_pretrained`` is refused in one line."""

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from plasticlm.config import override
from plasticlm.errors import PlasticError
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.methods import FEDERATED_METHODS, prepare_model
from plasticlm.memory import attach_memory, detach_memory, save_pretrained
from plasticlm.models import build_tiny, train_bpe_tokenizer

WINDOW = 8


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(["the cat sat on the mat and the dog ran to the park"] * 20,
                               vocab_size=300)


def _base(tok, seed: int = 0):
    torch.manual_seed(seed)
    return build_tiny("qwen3", vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2,
                      num_kv_heads=1)


def _trained(method: str, tok):
    """``method`` prepared as a FedNL run prepares it (window 8), its trainable weights moved
    as training would (random, so every LoRA B is non-zero)."""
    cfg = override(FedNLConfig(), {"method.name": method, "method.window": WINDOW})
    model = prepare_model(_base(tok), cfg.method, cfg.memory)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_lora_fedavg_adapter_loads_on_a_plain_model_with_its_logits(tok, tmp_path):
    trained = _trained("fedavg", tok)
    FEDERATED_METHODS["fedavg"]().save(trained, tok, tmp_path / "final")
    plain = _base(tok)
    loaded = PeftModel.from_pretrained(plain, tmp_path / "final").eval()
    lora = {n: p for n, p in loaded.named_parameters() if "lora_B" in n}
    assert lora and all(p.abs().sum() > 0 for p in lora.values()), "a LoRA B stayed zero"
    short = torch.randint(0, len(tok), (2, WINDOW))
    assert torch.allclose(_logits(loaded, short), _logits(trained, short), atol=1e-5)
    assert not torch.allclose(_logits(_base(tok), short), _logits(trained, short), atol=1e-3)
    card = (tmp_path / "final" / "README.md").read_text()
    assert "PeftModel.from_pretrained" in card and f"windowed attention ({WINDOW} tokens)" in card


def test_windowed_full_fedavg_reloads_with_transformers(tok, tmp_path):
    trained = _trained("fedavg-full", tok)
    FEDERATED_METHODS["fedavg-full"]().save(trained, tok, tmp_path / "final")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final").eval()
    short = torch.randint(0, len(tok), (2, WINDOW))
    assert torch.allclose(_logits(reloaded, short), _logits(trained, short), atol=1e-5)


def test_memory_attached_save_pretrained_is_refused_and_theta_has_a_card(tok, tmp_path):
    model = attach_memory(_base(tok), layers=[1], window=WINDOW, rank=2)
    with pytest.raises(PlasticError, match=r"plasticlm.memory.save_pretrained\(model, DIR\)"):
        model.save_pretrained(tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    save_pretrained(model, tmp_path / "theta")
    assert "plasticlm.memory.from_pretrained" in (tmp_path / "theta" / "README.md").read_text()
    detach_memory(model).save_pretrained(tmp_path / "plain")      # plain again: its own save
    assert (tmp_path / "plain" / "config.json").exists()
