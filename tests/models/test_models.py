import pytest
import torch

from plasticlm.errors import PlasticError
from plasticlm.models import build_tiny, describe, load_causal_lm, train_bpe_tokenizer

TEXT = ["The little robot counted the stars, one by one, until morning.",
        "Numbers like 3.14 and words like naïve or 日本 survive a round trip."]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_build_tiny_round_trips_through_save_pretrained(arch, tmp_path):
    model = build_tiny(arch, vocab_size=300, hidden_size=64, num_layers=2, num_heads=4,
                       num_kv_heads=2)
    tok = train_bpe_tokenizer(TEXT * 20, vocab_size=300)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, tok2 = load_causal_lm(tmp_path)
    info = describe(loaded)
    assert (info["model_type"], info["layers"], info["heads"], info["kv_heads"]) == (arch, 2, 4, 2)
    ids = torch.tensor([tok2(TEXT[0]).input_ids])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits, atol=1e-6)


def test_build_tiny_is_seeded():
    a = build_tiny("qwen3", seed=3, vocab_size=64, hidden_size=32, num_layers=1, num_heads=2)
    b = build_tiny("qwen3", seed=3, vocab_size=64, hidden_size=32, num_layers=1, num_heads=2)
    c = build_tiny("qwen3", seed=4, vocab_size=64, hidden_size=32, num_layers=1, num_heads=2)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_build_tiny_rejects_bad_sizes():
    with pytest.raises(PlasticError, match="unknown architecture"):
        build_tiny("gpt2")
    with pytest.raises(PlasticError, match="multiple"):
        build_tiny("llama", num_heads=4, num_kv_heads=3)


def test_tokenizer_round_trips_real_text():
    tok = train_bpe_tokenizer(TEXT * 20, vocab_size=280)
    for text in TEXT:
        assert tok.decode(tok(text).input_ids) == text


def test_missing_model_offline_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PlasticError, match="not in the local Hugging Face cache, and the hub is off") as e:
        load_causal_lm("no-such-org/no-such-model-xyz")
    assert "no-such-model-xyz" in str(e.value)


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(PlasticError, match="config.json"):
        load_causal_lm(tmp_path)


def test_unknown_dtype_is_rejected(tmp_path):
    with pytest.raises(PlasticError, match="dtype"):
        load_causal_lm(tmp_path, dtype="float8")
