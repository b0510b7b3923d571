"""The SCoL policy: the LM names, in text, the layers to update for a context.

An action is the text ``layers: 3, 7``. :func:`parse_layers` turns any text into a sorted
set of valid layer indices (never raising); :class:`LayerGrammar` is a token-level automaton
over the tokenizer's vocabulary so that constrained decoding (:func:`sample_actions`) can
only emit texts of that grammar, even from a small or untrained model. Its masks are as wide
as the logits (:func:`plasticlm.eval.logits_width`), and only ids the tokenizer decodes are
ever allowed in them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from plasticlm.errors import PlasticError
from plasticlm.eval import encode_with_bos, logits_width

PREFIX = "layers: "
SEPARATOR = ", "
_INTEGER = re.compile(r"-?\d+")
# ASCII-only case folding: str.lower() can change a text's length (e.g. "İ"), which would
# shift an index found in the lowered text
_WORD = re.compile("layers:", re.IGNORECASE | re.ASCII)
# no layer index has more digits; int() refuses texts of thousands of digits
_MAX_DIGITS = 9


def action_prompt(context: str, num_layers: int, max_chars: int = 2000) -> str:
    """The prompt that asks the model which of its ``num_layers`` layers should learn
    ``context`` (the context's last ``max_chars`` characters). It ends with the forced prefix
    ``layers: ``, so the prefix is tokenised one canonical way, with the prompt, and the
    completion holds only the layer numbers the model chooses."""
    text = context[-max_chars:]
    return (f"{text}\n\nTo remember the text above, update some of the {num_layers} layers "
            f"(0 to {num_layers - 1}).\n{PREFIX}")


@dataclass(frozen=True)
class ParsedAction:
    """Valid layers (sorted, unique) and counts of what the parser had to drop."""

    layers: tuple[int, ...]
    out_of_range: int = 0
    duplicates: int = 0
    garbage: bool = False   # no integer at all in the text

    @property
    def valid(self) -> bool:
        return bool(self.layers) and not self.out_of_range and not self.duplicates


def parse_layers(text: str, num_layers: int) -> ParsedAction:
    """Layer indices named in ``text``: integers after ``layers:`` (or anywhere when that
    word is absent), kept when ``0 <= i < num_layers``; drops are counted, nothing raises."""
    word = _WORD.search(text)
    body = text[word.end():] if word else text
    numbers = [int(m) if len(m.lstrip("-")) <= _MAX_DIGITS else None
               for m in _INTEGER.findall(body)]
    kept: list[int] = []
    out_of_range = duplicates = 0
    for n in numbers:
        if n is None or not 0 <= n < num_layers:
            out_of_range += 1
        elif n in kept:
            duplicates += 1
        else:
            kept.append(n)
    return ParsedAction(tuple(sorted(kept)), out_of_range, duplicates, not numbers)


def format_action(layers) -> str:
    return PREFIX + SEPARATOR.join(str(i) for i in sorted(layers))


# Automaton state: (literal being matched, chars of it matched, digits of the current
# number, layers already chosen). A literal fully matched means "inside a number".
State = tuple[str, int, str, frozenset]


class LayerGrammar:
    """Token-level automaton for the completion ``d(, d)*`` after the prompt's ``layers: ``,
    with distinct ``d < num_layers`` and at most ``max_layers`` numbers; the end token is
    allowed only where the text is complete.

    Token texts are found by decoding each id after an anchor token, which also handles
    sentencepiece-style tokenizers that drop a leading space when a token is decoded alone.
    Masks are [width], the model's logits width (:meth:`for_model`); ids the tokenizer
    cannot decode (``>= len(tokenizer)``) are never allowed.
    """

    def __init__(self, tokenizer, num_layers: int, max_layers: int | None = None, *,
                 width: int):
        if num_layers < 1:
            raise PlasticError(f"num_layers must be >= 1, not {num_layers}")
        self.num_layers = num_layers
        self.max_layers = min(max_layers or num_layers, num_layers)
        self.end_id = tokenizer.eos_token_id
        if self.end_id is None:
            raise PlasticError("the tokenizer has no EOS token to end an action with; set "
                               "tokenizer.eos_token")
        if not 0 <= self.end_id < min(width, len(tokenizer)):
            raise PlasticError(f"the EOS id {self.end_id} is outside the {width} logits or the "
                               f"{len(tokenizer)} ids the tokenizer decodes")
        self.vocab_size = width   # the logits width: every mask is [width]
        alphabet = set(SEPARATOR + "0123456789")
        special = set(tokenizer.all_special_ids)
        anchor = tokenizer("a", add_special_tokens=False)["input_ids"]
        base = tokenizer.decode(anchor)
        self.token_text: dict[int, str] = {}
        for i in range(min(width, len(tokenizer))):   # decodable ids only
            if i in special:
                continue
            s = tokenizer.decode(anchor + [i])
            s = s[len(base):] if s.startswith(base) else tokenizer.decode([i])
            if s and set(s) <= alphabet:
                self.token_text[i] = s
        self._masks: dict[State, torch.Tensor] = {}

    @classmethod
    def for_model(cls, model, tokenizer, num_layers: int, max_layers: int | None = None
                  ) -> LayerGrammar:
        """The grammar for ``model``'s logits (masks [V], V = its logits width)."""
        return cls(tokenizer, num_layers, max_layers, width=logits_width(model))

    def check_width(self, logits: torch.Tensor) -> None:
        """Refuse logits [..., V] whose V is not this grammar's mask width."""
        if logits.shape[-1] != self.vocab_size:
            raise PlasticError(f"the action grammar's masks are {self.vocab_size} wide but the "
                               f"model's logits are {logits.shape[-1]}: build it with "
                               "LayerGrammar.for_model(model, ...)")

    def start(self) -> State:
        """The state right after the prompt's forced ``layers: ``."""
        return (PREFIX, len(PREFIX), "", frozenset())

    def _prefix_ok(self, digits: str, chosen: frozenset) -> bool:
        if len(digits) > 1 and digits[0] == "0":
            return False
        return any(str(n).startswith(digits) for n in range(self.num_layers) if n not in chosen)

    def _complete(self, digits: str, chosen: frozenset) -> bool:
        return (bool(digits) and not (len(digits) > 1 and digits[0] == "0")
                and int(digits) < self.num_layers and int(digits) not in chosen)

    def step_char(self, state: State, ch: str) -> State | None:
        lit, i, digits, chosen = state
        if i < len(lit):
            return (lit, i + 1, digits, chosen) if ch == lit[i] else None
        if "0" <= ch <= "9":
            nd = digits + ch
            return (lit, i, nd, chosen) if self._prefix_ok(nd, chosen) else None
        if ch == "," and self._complete(digits, chosen) and len(chosen) + 1 < self.max_layers:
            return (SEPARATOR, 1, "", chosen | {int(digits)})
        return None

    def step_text(self, state: State, text: str) -> State | None:
        for ch in text:
            state = self.step_char(state, ch)
            if state is None:
                return None
        return state

    def accepting(self, state: State) -> bool:
        lit, i, digits, chosen = state
        return i == len(lit) and self._complete(digits, chosen)

    def allowed(self, state: State) -> torch.Tensor:
        """Bool mask [V] (V = the logits width) of the tokens that keep the text inside the
        grammar; always False from ``len(tokenizer)`` up."""
        mask = self._masks.get(state)
        if mask is None:
            mask = torch.zeros(self.vocab_size, dtype=torch.bool)
            for tid, text in self.token_text.items():
                if self.step_text(state, text) is not None:
                    mask[tid] = True
            if self.accepting(state):
                mask[self.end_id] = True
            if not mask.any():
                raise PlasticError("no token of this tokenizer can continue the action grammar "
                                   f"from {state[0][:state[1]]!r}{state[2]!r}; the tokenizer "
                                   "needs single-character tokens for digits and 'layers: '")
            self._masks[state] = mask
        return mask

    def advance(self, state: State, token_id: int) -> State | None:
        """The state after ``token_id``; None after the end token or outside the grammar."""
        if token_id == self.end_id:
            return None
        return self.step_text(state, self.token_text.get(token_id, "\x00"))

    def masks_for(self, token_ids) -> list[torch.Tensor]:
        """The allowed-token mask before each token of a completion (for entropy terms)."""
        state: State | None = self.start()
        out = []
        for tid in token_ids:
            if state is None:
                break
            out.append(self.allowed(state))
            state = self.advance(state, int(tid))
        return out


@dataclass
class Action:
    """One sampled action: its text, completion token ids and the parsed layers."""

    text: str
    token_ids: list[int]
    layers: tuple[int, ...]
    parsed: ParsedAction = field(repr=False, default=None)


@torch.no_grad()
def sample_actions(model, tokenizer, prompt: str, grammar: LayerGrammar, k: int = 1,
                   temperature: float = 1.0, generator: torch.Generator | None = None
                   ) -> list[Action]:
    """``k`` actions decoded under ``grammar`` after ``prompt`` (temperature 0: greedy).

    All rows share the prompt, so one batch [k, T] with a KV cache decodes them together;
    rows that ended are fed the end token and ignored. Only the last position's logits [k, V]
    are computed at each step; the grammar's masks never allow an undecodable id.
    """
    if k < 1:
        raise PlasticError(f"k must be >= 1, not {k}")
    device = next(model.parameters()).device
    ids = torch.tensor([encode_with_bos(tokenizer, prompt)] * k, device=device)
    states: list[State | None] = [grammar.start()] * k
    completions: list[list[int]] = [[] for _ in range(k)]
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    cache = out.cache
    logits = out.logits[:, -1].float()
    grammar.check_width(logits)
    # The grammar is finite: every token consumes a character, so this many steps suffice.
    limit = len(PREFIX) + grammar.max_layers * (len(str(grammar.num_layers)) + len(SEPARATOR)) + 1
    for _ in range(limit):
        if all(s is None for s in states):
            break
        nxt = torch.full((k,), grammar.end_id, dtype=torch.long)
        for r, state in enumerate(states):
            if state is None:
                continue
            masked = logits[r].cpu().masked_fill(~grammar.allowed(state), float("-inf"))
            if temperature <= 0:
                tid = int(masked.argmax())
            else:
                probs = torch.softmax(masked / temperature, -1)
                tid = int(torch.multinomial(probs, 1, generator=generator))
            nxt[r] = tid
            completions[r].append(tid)
            states[r] = grammar.advance(state, tid)
        out = model(input_ids=nxt[:, None].to(device), cache=cache, use_cache=True,
                    logits_to_keep=1)
        cache = out.cache
        logits = out.logits[:, -1].float()
    actions = []
    for comp in completions:
        text = PREFIX + "".join(grammar.token_text.get(t, "") for t in comp
                                if t != grammar.end_id)
        parsed = parse_layers(text, grammar.num_layers)
        actions.append(Action(text, comp, parsed.layers, parsed))
    return actions
