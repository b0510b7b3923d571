"""The real-shape lane: every method on random-initialised models with the published
configurations of Qwen2.5-0.5B, Qwen3-0.6B and Llama-3.2-1B (full padded vocabulary, real
widths, heads, GQA and RoPE; layers cut to 2), paired with a tokenizer far shorter than the
logits. Run alone with ``pytest -m realshape``."""

import pytest

from plasticlm.models import load_causal_lm
from plasticlm.models.shapes import SHAPES, TESTED_SHAPES
from plasticlm.sandbox import resolve_model_spec

LAYERS = 2


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/realshape/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.realshape)


@pytest.fixture(scope="session", params=TESTED_SHAPES)
def shape(request) -> str:
    """Each tested shape's name in turn."""
    return request.param


def shape_spec(name: str, layers: int = LAYERS) -> str:
    return f"shape:{name}@{layers}"


@pytest.fixture(scope="session")
def spec_of():
    """name -> the model spec (``shape:<name>@2``) any command accepts."""
    return shape_spec


@pytest.fixture(scope="session")
def shape_folder():
    """name -> the HF folder of that shape cut to 2 layers (built once per session)."""
    cache = {}

    def get(name: str, layers: int = LAYERS):
        key = (name, layers)
        if key not in cache:
            cache[key] = resolve_model_spec(shape_spec(name, layers))
        return cache[key]
    return get


@pytest.fixture(scope="session")
def shape_model(shape_folder):
    """name -> (model, tokenizer) in float32 on the CPU, loaded fresh at each call (tests
    change models in place)."""
    def get(name: str, layers: int = LAYERS, dtype: str = "float32"):
        model, tokenizer = load_causal_lm(shape_folder(name, layers), dtype=dtype, device="cpu")
        assert model.config.vocab_size == SHAPES[name]["vocab_size"] > len(tokenizer)
        return model, tokenizer
    return get
