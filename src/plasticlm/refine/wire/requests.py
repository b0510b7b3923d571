"""What a request to a peer service may ask, and how much: the JSON bodies of ``/prefill``,
``/generate``, ``/ask`` (and the request inside an ``/answer`` bundle), and their limits in
tokens (choices, prompt, new tokens; the settings of :class:`ServiceConfig`), checked before
any model runs. The body as a whole is bounded by :mod:`plasticlm.refine.wire.guard`."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

from plasticlm.refine.fusers.fuser_config import Share
from plasticlm.refine.modes import MODES, Order
from plasticlm.refine.wire.quant import QUANTS
from plasticlm.refine.wire.serving import ServiceConfig, TooLarge

MAX_TEXT_CHARS = 8000   # a ceiling before tokenizing: the token limits are the settings
Quant = Annotated[str, QUANTS.key]
Text = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT_CHARS)]
Short = Annotated[str, StringConstraints(max_length=64)]


class PrefillRequest(BaseModel):
    text: Text
    draft_tokens: int = Field(0, ge=0)
    layers: list[int] | None = Field(None, max_length=256)
    share: Share = "all"
    quant: Quant = "bf16"


class GenerateRequest(BaseModel):
    text: Text
    max_new_tokens: int = Field(24, ge=1)
    stop: list[Short] = Field(default_factory=lambda: ["\n"], max_length=8)


class AskRequest(BaseModel):
    prompt: Text
    mode: Annotated[str, MODES.key] = "c2c"
    choices: list[Text] = Field(default_factory=list)
    max_new_tokens: int = Field(24, ge=1)
    private: bool = False
    order: Order = "parallel"
    quant: Quant | None = None    # /ask: how the peers send caches (default: the service's)
    # t2t and multi: the first n of the receiver's transmitters (default: all), so that a
    # text row and a cache row can use the same transmitters
    transmitters: int | None = Field(None, ge=1, le=64)


def _tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def check_limits(config: ServiceConfig, tokenizer, text: str, choices: list[str] = (),
                 new_tokens: int = 0) -> None:
    """:class:`TooLarge` naming the setting when ``text`` (a prompt), ``choices`` or
    ``new_tokens`` pass the service's limits; counts first, so nothing large is tokenized."""
    if len(choices) > config.max_choices:
        raise TooLarge(f"{len(choices)} choices; this service scores at most "
                       f"{config.max_choices} (max_choices)")
    if new_tokens > config.max_new_tokens:
        raise TooLarge(f"{new_tokens} new tokens asked; this service generates at most "
                       f"{config.max_new_tokens} (max_new_tokens)")
    n = _tokens(tokenizer, text)
    if n > config.max_prompt_tokens:
        raise TooLarge(f"a prompt of {n} tokens; this service takes at most "
                       f"{config.max_prompt_tokens} (max_prompt_tokens)")
    for i, choice in enumerate(choices):
        n = _tokens(tokenizer, choice)
        if n > config.max_choice_tokens:
            raise TooLarge(f"choice {i} has {n} tokens; this service takes at most "
                           f"{config.max_choice_tokens} per choice (max_choice_tokens)")
