"""SCoL: self-consolidating LMs that choose, in text, which layers learn each context.

policy (prompt, grammar-constrained decoding, parser), consolidate (LoRA on chosen layers,
merge into float32 masters), rewards, ipo, meta (inner/outer loop, checkpoints), baselines,
fisher, experiment (squad | longbench | fisher). The method of "Self-Consolidating Language Models" (SCoL).
"""

from plasticlm.scol.consolidate import LoraTrainConfig, adapt_lora, changed_parameters, layer_change
from plasticlm.scol.contexts import Context, contexts_from_passages, split_streams
from plasticlm.scol.ipo import PreferencePair, ipo_loss, preference_pairs
from plasticlm.scol.meta import SCoLConfig, consolidate_stream, meta_train
from plasticlm.scol.policy import (
    LayerGrammar,
    ParsedAction,
    action_prompt,
    format_action,
    parse_layers,
    sample_actions,
)
from plasticlm.scol.rewards import Question, Reward, intrinsic_reward, supervised_reward

__all__ = [
    "Context", "LayerGrammar", "LoraTrainConfig", "ParsedAction", "PreferencePair", "Question",
    "Reward", "SCoLConfig", "action_prompt", "adapt_lora", "changed_parameters",
    "consolidate_stream", "contexts_from_passages", "format_action", "intrinsic_reward",
    "ipo_loss", "layer_change", "meta_train", "parse_layers", "preference_pairs",
    "sample_actions", "split_streams", "supervised_reward",
]
