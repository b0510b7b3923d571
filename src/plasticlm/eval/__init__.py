"""Metrics: multiple choice, SQuAD EM/F1, NIAH, streaming CE, perplexity; the QA prompt
template (:mod:`plasticlm.eval.prompts`); intervals (:mod:`plasticlm.eval.stats`, the
:class:`CI` and its rendering in :mod:`plasticlm.eval.ci`) and control
measures (:mod:`plasticlm.eval.controls`).

Functions take plain fields (question, choices, answer) so they do not depend on
``plasticlm.data``'s records; ``*_items``/``*_for`` wrappers accept any object with the
matching attributes.
"""

from plasticlm.eval.ci import CI, format_ci, format_paired, format_summary, verdict
from plasticlm.eval.controls import (
    ClosedSetResult,
    SwappedItem,
    closed_set_accuracy,
    closed_set_choice,
    entity_swap_control,
    is_legal,
    legal_answer_rate,
    swap_entity,
)
from plasticlm.eval.encoding import encode_pair, encode_with_bos, pad_batch, pad_id_of
from plasticlm.eval.generation import cut_at_stop, generate_texts
from plasticlm.eval.multiple_choice import (
    LETTERS,
    MC_METHODS,
    MCConfig,
    MCResult,
    answer_index,
    choice_scores,
    evaluate_mc,
    evaluate_mc_items,
    extract_choice,
    mmlu_prompt,
)
from plasticlm.eval.niah import (
    niah_accuracy,
    niah_choice,
    niah_score,
    response_items,
    same_format_decoy,
)
from plasticlm.eval.perplexity import Perplexity, perplexity, windows
from plasticlm.eval.prompts import QA_TEMPLATE, context_prompt, qa_continuation, qa_line, qa_prompt
from plasticlm.eval.scoring import ContinuationScore, next_token_logprobs, score_continuations
from plasticlm.eval.squad import (
    SquadResult,
    exact_match,
    f1_score,
    normalize_answer,
    squad_metrics,
    squad_metrics_for,
    squad_score,
)
from plasticlm.eval.stats import (
    bootstrap_ci,
    paired_intervals,
    paired_seed_ci,
    paired_summary,
    pooled_bootstrap_ci,
    seed_ci,
    t_critical,
)
from plasticlm.eval.streaming import (
    StreamingCE,
    TokenLosses,
    bucket_means,
    chunked_token_losses,
    streaming_ce,
    streaming_ce_from_losses,
)
from plasticlm.eval.vocab import (
    decodable_mask,
    decodable_only,
    logits_width,
    mask_undecodable,
)

__all__ = [
    "CI", "ClosedSetResult", "ContinuationScore", "LETTERS", "MCConfig", "MCResult", "MC_METHODS",
    "Perplexity", "QA_TEMPLATE", "SquadResult", "StreamingCE", "SwappedItem", "TokenLosses",
    "answer_index", "bootstrap_ci", "bucket_means", "choice_scores", "chunked_token_losses",
    "closed_set_accuracy", "closed_set_choice", "context_prompt", "cut_at_stop", "encode_pair",
    "encode_with_bos",
    "entity_swap_control", "evaluate_mc", "evaluate_mc_items", "exact_match", "extract_choice",
    "decodable_mask", "decodable_only", "f1_score", "format_ci", "format_paired",
    "format_summary", "generate_texts", "is_legal", "legal_answer_rate", "logits_width",
    "mask_undecodable", "mmlu_prompt", "next_token_logprobs", "niah_accuracy", "niah_choice",
    "niah_score", "same_format_decoy",
    "normalize_answer", "pad_batch", "pad_id_of", "paired_intervals", "paired_seed_ci",
    "paired_summary", "perplexity", "pooled_bootstrap_ci", "qa_continuation", "qa_line",
    "qa_prompt", "response_items", "score_continuations", "seed_ci", "squad_metrics",
    "squad_metrics_for", "squad_score", "streaming_ce", "streaming_ce_from_losses",
    "swap_entity", "t_critical", "verdict", "windows",
]
