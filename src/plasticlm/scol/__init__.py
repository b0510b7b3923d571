"""SCoL: self-consolidating LMs that choose, in text, which layers learn each context.

records (contexts, questions, rewards), policy (prompt, grammar-constrained decoding,
parser), consolidate (LoRA on chosen layers, merge into float32 masters), rewards (the
``REWARDS`` registry), selections (``SELECTIONS``: how a context's layers are chosen),
stream (the inner loop), ipo, meta (the outer loop, checkpoints), baselines (``SCOL_METHODS``:
SCoL and what it is compared with), fisher, experiment (squad | longbench | fisher | sweep |
gate). The method of "Self-Consolidating Language Models" (SCoL).
"""

from plasticlm.scol.baselines import SCOL_METHODS
from plasticlm.scol.config import SCoLConfig
from plasticlm.scol.consolidate import LoraTrainConfig, adapt_lora, changed_parameters, layer_change
from plasticlm.scol.contexts import contexts_from_passages, split_streams
from plasticlm.scol.ipo import PreferencePair, ipo_loss, preference_pairs
from plasticlm.scol.meta import meta_train
from plasticlm.scol.policy import (
    LayerGrammar,
    ParsedAction,
    action_prompt,
    format_action,
    parse_layers,
    sample_actions,
)
from plasticlm.scol.records import Context, Question, Reward
from plasticlm.scol.rewards import REWARDS, intrinsic_reward, supervised_reward
from plasticlm.scol.selections import SELECTIONS
from plasticlm.scol.stream import consolidate_stream

__all__ = [
    "SCOL_METHODS", "REWARDS", "SELECTIONS", "Context", "LayerGrammar", "LoraTrainConfig", "ParsedAction", "PreferencePair", "Question",
    "Reward", "SCoLConfig", "action_prompt", "adapt_lora", "changed_parameters",
    "consolidate_stream", "contexts_from_passages", "format_action", "intrinsic_reward",
    "ipo_loss", "layer_change", "meta_train", "parse_layers", "preference_pairs",
    "sample_actions", "split_streams", "supervised_reward",
]
