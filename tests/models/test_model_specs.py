"""Model and data specs as registered schemes (issue 58, item 3): mechanism code resolves
``sandbox:``/``shape:`` specs through ``plasticlm.models.specs`` without importing the sandbox,
which registers itself by an entry point; a third party's scheme resolves the same way."""

import subprocess
import sys
from pathlib import Path

import pytest

from plasticlm.errors import PlasticError
from plasticlm.models import specs


def test_folders_and_hub_ids_are_themselves_and_a_world_is_not_a_model():
    assert specs.resolve_model("/models/Qwen2.5-0.5B") == "/models/Qwen2.5-0.5B"
    assert specs.resolve_model("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert specs.resolve_data("/data/mmlu") == Path("/data/mmlu")
    assert specs.is_named_spec("sandbox:receiver") and specs.is_named_spec("sandbox-quick")
    assert specs.is_named_spec("shape:qwen3-0.6b@2") and not specs.is_named_spec("./sandboxes")
    with pytest.raises(PlasticError, match="names a sandbox world; a sandbox model is"):
        specs.resolve_model("sandbox")
    with pytest.raises(PlasticError, match="names a model, not a data folder"):
        specs.resolve_data("shape:qwen3-0.6b@2")


def test_the_sandbox_registers_itself_by_its_entry_point():
    """In a fresh process that never imports the sandbox, ``quick:receiver`` is claimed by the
    sandbox's scheme, loaded from the installed entry point (not an import of the caller)."""
    code = ("import sys\nfrom plasticlm.models.specs import owner_of, schemes\n"
            "assert 'plasticlm.sandbox' not in sys.modules\n"
            "print(sorted(schemes()), type(owner_of('quick:receiver')).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")[0]
    assert out == "['sandbox', 'shape'] SandboxScheme"


def test_a_third_party_scheme_resolves_models_and_data(monkeypatch):
    class Zoo:
        def claims(self, spec):
            return spec.startswith("zoo:")

        def model(self, spec):
            return f"/zoo/models/{spec[4:]}"

        def data(self, spec):
            return Path(f"/zoo/data/{spec[4:]}")
    monkeypatch.setattr(specs, "_schemes", dict(specs.schemes()))
    specs.register_scheme("zoo", Zoo())
    assert specs.resolve_model("zoo:llama") == "/zoo/models/llama"
    assert specs.resolve_data("zoo:stories") == Path("/zoo/data/stories")
    assert specs.resolve_model("zoology/model") == "zoology/model"
