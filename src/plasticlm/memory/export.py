"""What a windowed or memory-attached model writes, so that the ecosystem's own tools load it.

:func:`attach_memory` wraps every ``self_attn`` in a :class:`MemoryAttention` whose ``base`` is
the original module, so the base weights are named ``...self_attn.base.q_proj...`` inside the
wrapped model. A folder written with those names is silently wrong outside plasticlm:
transformers reloads q/k/v/o randomly initialised, and PEFT loads a LoRA adapter onto a plain
model with every ``lora_B`` left at zero. So:

- the model's own ``save_pretrained`` is refused in one line, naming what to call instead;
- :func:`save_base_model` writes the base weights under the plain model's names (an HF folder
  ``AutoModelForCausalLM.from_pretrained`` loads: without the window or the memory);
- :func:`plain_peft_adapter` renames the keys of a PEFT adapter saved from a windowed model, so
  ``PeftModel.from_pretrained(plain_model, folder)`` loads every LoRA weight.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from plasticlm.errors import PlasticError

WRAPPED, PLAIN = ".self_attn.base.", ".self_attn."
PEFT_WEIGHTS = "adapter_model.safetensors"


def plain_key(key: str) -> str:
    """``key`` of a wrapped model as the plain HF model names it."""
    return key.replace(WRAPPED, PLAIN)


def refuse_plain_save(*args, **kwargs) -> None:
    """Stands in for ``save_pretrained`` on a model with memory or a window attached."""
    raise PlasticError(
        "this model has plasticlm's memory or window attached: its save_pretrained would write "
        "a folder transformers reloads without them (and with q/k/v/o randomly initialised); "
        "save theta with plasticlm.memory.save_pretrained(model, DIR) (it loads back with "
        "plasticlm.memory.from_pretrained(base_model, DIR)), or the base weights with "
        "plasticlm.memory.save_base_model(model, DIR)")


def save_base_model(model: nn.Module, directory: str | Path, **kwargs) -> Path:
    """Write ``model``'s base weights (theta left out) as an HF folder under the plain model's
    names: ``AutoModelForCausalLM.from_pretrained(directory)`` gives the base model, which
    attends to the whole context (identical logits on inputs within the window when no memory
    layer is attached). ``kwargs`` go to transformers' ``save_pretrained``."""
    if getattr(model, "memory_config", None) is None:
        model.save_pretrained(str(directory), **kwargs)     # a plain model: its own names
        return Path(directory)
    state = {}
    for key, value in model.state_dict().items():
        if ".self_attn." in key and WRAPPED not in key:
            continue                      # theta (the memory's own parameters)
        state[plain_key(key)] = value
    # the class's method: the instance's own is the refusal above
    type(model).save_pretrained(model, str(directory), state_dict=state, **kwargs)
    return Path(directory)


def plain_peft_adapter(folder: str | Path) -> int:
    """Rename the keys of the PEFT adapter in ``folder`` (saved from a windowed model) to the
    plain model's; returns how many keys changed. Metadata is kept."""
    path = Path(folder) / PEFT_WEIGHTS
    if not path.is_file():
        raise PlasticError(f"{path} does not exist: is {folder} a PEFT adapter folder?")
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
        tensors = {plain_key(k): f.get_tensor(k) for k in f.keys()}   # noqa: SIM118
        changed = sum(plain_key(k) != k for k in f.keys())           # noqa: SIM118
    if changed:
        save_file(tensors, str(path), metadata=metadata)
    return changed


def append_model_card(folder: str | Path, section: str) -> None:
    """Add ``section`` (Markdown) to ``folder``'s README.md (PEFT's model card, or a new one)."""
    card = Path(folder) / "README.md"
    text = card.read_text(encoding="utf-8") if card.exists() else ""
    card.write_text(text.rstrip("\n") + ("\n\n" if text else "") + section.strip() + "\n",
                    encoding="utf-8")


def portable_peft_adapter(folder: str | Path, window: int | None, written_by: str) -> None:
    """Make the PEFT adapter PEFT saved in ``folder`` load on a plain model (its keys renamed
    by :func:`plain_peft_adapter`) and say so in its model card; ``window``: the attention
    window it was trained with, or None."""
    plain_peft_adapter(folder)
    note = (f"It was trained with plasticlm's windowed attention ({window} tokens); a plain "
            "model attends to the whole context, so the logits are the trained model's on "
            "inputs of at most that many tokens. For the window too, call "
            f"`plasticlm.memory.attach_memory(base, layers=[], window={window})` before "
            "loading." if window else "")
    append_model_card(folder, f"""## Loading it

A PEFT LoRA adapter written by `{written_by}`: load it with
`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), FOLDER)`, where BASE is
the base model the run used. {note}""")
