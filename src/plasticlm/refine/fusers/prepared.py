"""Training examples prepared once for fuser training: the frozen receiver's, transmitter's
(and a cache teacher's) caches of each prompt, the token alignment, the tail and answer
tokens; and the fused, stacked state and answer loss of a batch of them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from plasticlm.errors import PlasticError
from plasticlm.eval import encode_pair, pad_batch, pad_id_of, qa_continuation, score_continuations
from plasticlm.refine.cache import KVCache, continue_from_cache, extract_cache, stack_caches
from plasticlm.refine.examples import Example
from plasticlm.refine.fusers.align import align_tokens, entity_positions
from plasticlm.refine.fusers.fuser import Fuser
from plasticlm.refine.fusers.objectives import needs_choices
from plasticlm.refine.peer import Peer, as_batch, continuation_ids, prompt_ids, transmitter_ids


@dataclass
class Prepared:
    own: KVCache | None          # receiver cache before fusion (aligned) or its BOS (prefix)
    transmitter: KVCache
    index: torch.Tensor | None
    tail: list[int]
    answer: list[int]
    start: int | None = None     # position of tail[0] when not right after the cache
    prompt_length: int | None = None  # prefix mode: transmitter tokens before its draft
    teacher: KVCache | None = None    # aligned: the teacher's cache of the positions of own
    focus: list[int] | None = None    # aligned: positions of own at the entity's tokens
    choices: list[list[int]] | None = None   # receiver tokens of each answer choice
    target: torch.Tensor | None = None       # [C] the transmitter's probabilities of them


@torch.no_grad()
def transmitter_choice_probs(transmitter: Peer, prompt: str, choices: tuple[str, ...]
                             ) -> torch.Tensor:
    """[C] the transmitter's own distribution over ``choices`` after ``prompt``: softmax of
    each `` <choice>``'s summed log-probability, in the transmitter's vocabulary (what a
    transmitter that knows the answer can give without any oracle)."""
    pairs = [encode_pair(transmitter.tokenizer, prompt, qa_continuation(c)) for c in choices]
    scored = score_continuations(transmitter.model, [a for a, _ in pairs], [b for _, b in pairs],
                                 pad_id_of(transmitter.tokenizer))
    return torch.softmax(torch.tensor([s.logprob for s in scored]), dim=0)


def prepare_example(receiver: Peer, transmitter: Peer, ex: Example, mode: str,
             fuse_last: bool = False, draft_tokens: int = 0,
             teacher: Peer | None = None, choice_target: bool = False) -> Prepared:
    p = _prepare(receiver, transmitter, ex, mode, fuse_last, draft_tokens, teacher)
    if choice_target:
        if len(ex.choices) < 2:
            raise PlasticError(f"example {ex.prompt[:40]!r} has no answer choices: the "
                               "choice-kl objective needs multiple-choice examples")
        r_ids = prompt_ids(receiver.tokenizer, ex.prompt)
        p.choices = [continuation_ids(receiver.tokenizer, r_ids, ex.prompt, qa_continuation(c))
                     for c in ex.choices]
        p.target = transmitter_choice_probs(transmitter, ex.transmitter_text or ex.prompt,
                                            ex.choices)
    return p


def _prepare(receiver: Peer, transmitter: Peer, ex: Example, mode: str, fuse_last: bool,
             draft_tokens: int, teacher: Peer | None) -> Prepared:
    r_ids = prompt_ids(receiver.tokenizer, ex.prompt)
    answer = continuation_ids(receiver.tokenizer, r_ids, ex.prompt, ex.answer)
    if mode == "aligned":
        al = align_tokens(receiver.tokenizer, transmitter.tokenizer, ex.prompt)
        n = len(r_ids) if fuse_last else len(r_ids) - 1
        own, _ = extract_cache(receiver.model, as_batch(r_ids[:n]))
        t_cache, _ = extract_cache(transmitter.model, as_batch(al.transmitter_ids))
        target = None
        if teacher is not None:
            if prompt_ids(teacher.tokenizer, ex.prompt) != r_ids:
                raise PlasticError(f"the teacher {teacher.name!r} tokenizes {ex.prompt[:40]!r} "
                                   "unlike the receiver: a cache teacher needs the receiver's "
                                   "tokenizer")
            target, _ = extract_cache(teacher.model, as_batch(r_ids[:n]))
        focus = None
        if ex.entity:
            focus = [i for i in entity_positions(receiver.tokenizer, ex.prompt, ex.entity)
                     if i < n]
        return Prepared(own, t_cache, torch.tensor([al.index[:n]]), r_ids[-1:], answer,
                         len(r_ids) - 1, teacher=target, focus=focus)
    if teacher is not None:
        raise PlasticError("a cache teacher needs mode=aligned (prefix positions have no "
                           "teacher counterpart)")
    text = ex.transmitter_text or ex.prompt
    t_cache, _ = extract_cache(transmitter.model,
                               as_batch(transmitter_ids(transmitter, text, draft_tokens)))
    n = len(prompt_ids(transmitter.tokenizer, text))
    bos = receiver.tokenizer.bos_token_id
    if bos is not None and r_ids[0] == bos:
        own, _ = extract_cache(receiver.model, as_batch(r_ids[:1]))
        return Prepared(own, t_cache, None, r_ids[1:], answer, prompt_length=n)
    return Prepared(None, t_cache, None, r_ids, answer, prompt_length=n)


def fused_state(fuser: Fuser, p: Prepared, receiver_layout) -> KVCache:
    """The receiver state a prepared example is scored from (gradients reach the fuser)."""
    if fuser.config.mode == "aligned":
        return fuser.fuse_aligned(p.own, p.transmitter, p.index)
    start = 1 if p.own is not None else 0
    prefix = fuser.prefix(p.transmitter, receiver_layout, start=start,
                          prompt_length=p.prompt_length)
    return p.own.cat(prefix) if p.own is not None else prefix


def answer_loss(receiver_model, state: KVCache, tail: list[int], answer: list[int],
                start: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of ``answer`` tokens after running ``tail`` on ``state`` (``tail[0]``
    at position ``start``, default right after the cache)."""
    ids = as_batch(tail + answer[:-1])
    starts = None if start is None else torch.tensor([start])
    logits = continue_from_cache(receiver_model, state, ids,
                                 start_positions=starts)[0, len(tail) - 1:]
    target = torch.tensor(answer, device=logits.device)
    return torch.nn.functional.cross_entropy(logits.float(), target)


def fused_batch_state(fuser: Fuser, batch: list[Prepared], receiver_layout) -> KVCache:
    """The fused states of a batch, stacked (left-padded). Aligned fusion runs once on the
    stacked caches (each row's transmitter index shifted by its padding); prefix fusion runs
    per example."""
    if fuser.config.mode != "aligned":
        return stack_caches([fused_state(fuser, p, receiver_layout) for p in batch])
    own = stack_caches([p.own for p in batch])
    sent = stack_caches([p.transmitter for p in batch])
    index = torch.zeros(len(batch), own.length, dtype=torch.long)
    for i, p in enumerate(batch):
        index[i, own.length - p.own.length:] = p.index[0] + (sent.length - p.transmitter.length)
    return fuser.fuse_aligned(own, sent, index)


def batch_answer_loss(receiver_model, pad_id: int, state: KVCache, batch: list[Prepared]
                      ) -> torch.Tensor:
    """The mean over examples of :func:`answer_loss`, in one receiver forward from the
    stacked states (:func:`fused_batch_state`), each example's tail + answer right-padded."""
    ids, mask = pad_batch([p.tail + p.answer[:-1] for p in batch], pad_id)
    starts = torch.tensor([p.start if p.start is not None else int(state.mask[i].sum())
                           for i, p in enumerate(batch)])
    logits = continue_from_cache(receiver_model, state, ids, mask, start_positions=starts)
    losses = []
    for i, p in enumerate(batch):
        rows = logits[i, len(p.tail) - 1: len(p.tail) - 1 + len(p.answer)]
        target = torch.tensor(p.answer, device=rows.device)
        losses.append(torch.nn.functional.cross_entropy(rows.float(), target))
    return torch.stack(losses).mean()


def batch_choice_logprobs(receiver_model, pad_id: int, state: KVCache, batch: list[Prepared]
                          ) -> list[torch.Tensor]:
    """Per example, [C] the receiver's summed log-probability of each answer choice after
    running its tail on its row of the stacked ``state``, in one forward over every choice of
    the batch (the state's rows repeated, one per choice)."""
    owner = [i for i, p in enumerate(batch) for _ in p.choices]
    seqs = [p.tail + c[:-1] for p in batch for c in p.choices]
    ids, mask = pad_batch(seqs, pad_id)
    rows = state.rows(owner)
    starts = torch.tensor([batch[i].start if batch[i].start is not None
                           else int(state.mask[i].sum()) for i in owner])
    logits = continue_from_cache(receiver_model, rows, ids, mask, start_positions=starts)
    out, k = [], 0
    for p in batch:
        scores = []
        for c in p.choices:
            row = logits[k, len(p.tail) - 1: len(p.tail) - 1 + len(c)].float()
            target = torch.tensor(c, device=row.device)
            scores.append(torch.log_softmax(row, -1).gather(1, target[:, None]).sum())
            k += 1
        out.append(torch.stack(scores))
    return out


def prepare_examples(receiver: Peer, transmitter: Peer, examples: list[Example],
                     cfg, progress: bool = False, teacher: Peer | None = None
                     ) -> list[Prepared]:
    """The frozen models' caches of every example (receiver, transmitter and, given, the
    teacher's), as :func:`plasticlm.refine.fusers.train.train_fusers` uses them; they depend on
    ``cfg``'s fusion mode, ``fuse_last`` and ``draft_tokens`` only, so one list serves every
    seed."""
    if teacher is not None and teacher.layout.num_layers != receiver.layout.num_layers:
        raise PlasticError(f"the teacher {teacher.name!r} has {teacher.layout.num_layers} "
                           f"layers, the receiver {receiver.layout.num_layers}: a cache "
                           "teacher needs the receiver's architecture")
    choice_target = needs_choices(cfg.objective)
    return [prepare_example(receiver, transmitter, ex, cfg.mode, cfg.fuse_last, cfg.draft_tokens,
                            teacher, choice_target)
            for ex in tqdm(examples, desc="caches", disable=not progress, leave=False)]
