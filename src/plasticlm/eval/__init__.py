"""Metrics: multiple choice, SQuAD EM/F1, NIAH, streaming CE, perplexity.

Functions take plain fields (question, choices, answer) so they do not depend on
``plasticlm.data``'s records; ``*_items``/``*_for`` wrappers accept any object with the
matching attributes.
"""

from plasticlm.eval.encoding import encode_pair, encode_with_bos, pad_batch, pad_id_of
from plasticlm.eval.generation import cut_at_stop, generate_texts
from plasticlm.eval.multiple_choice import (
    LETTERS,
    METHODS,
    MCConfig,
    MCResult,
    answer_index,
    choice_scores,
    evaluate_mc,
    evaluate_mc_items,
    extract_choice,
    mmlu_prompt,
)
from plasticlm.eval.niah import niah_accuracy, niah_score, response_items
from plasticlm.eval.perplexity import Perplexity, perplexity, windows
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
from plasticlm.eval.streaming import (
    StreamingCE,
    TokenLosses,
    bucket_means,
    chunked_token_losses,
    streaming_ce,
    streaming_ce_from_losses,
)

__all__ = [
    "LETTERS", "METHODS", "ContinuationScore", "MCConfig", "MCResult", "Perplexity",
    "SquadResult", "StreamingCE", "TokenLosses", "answer_index", "bucket_means",
    "choice_scores", "chunked_token_losses", "cut_at_stop", "encode_pair", "encode_with_bos",
    "evaluate_mc", "evaluate_mc_items", "exact_match", "extract_choice", "f1_score",
    "generate_texts", "mmlu_prompt", "next_token_logprobs", "niah_accuracy", "niah_score",
    "normalize_answer", "pad_batch", "pad_id_of", "perplexity", "response_items",
    "score_continuations", "squad_metrics", "squad_metrics_for", "squad_score",
    "streaming_ce", "streaming_ce_from_losses", "windows",
]
