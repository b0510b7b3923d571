"""SCoL's own settings: the inner loop (candidates, reward, LoRA) and the outer loop (IPO).
An experiment nests them as its ``scol`` section (:class:`plasticlm.experiments.scol.setup.ExperimentConfig`)."""

from __future__ import annotations

from typing import Annotated, Literal

from plasticlm.config import Field, configclass
from plasticlm.errors import PlasticError
from plasticlm.scol.consolidate import LoraTrainConfig
from plasticlm.scol.rewards import REWARDS, ForgetFrom, QAMetric


@configclass
class SCoLConfig:
    """Inner loop (candidates, reward, LoRA) and outer loop (IPO) settings."""

    k: int = Field(4, ge=1, description="candidate selections per context")
    temperature: float = Field(1.0, ge=0, description="sampling temperature of candidates "
                               "(0: greedy)")
    max_layers: int = Field(2, ge=1, description="most layers one action may name")
    reward: Annotated[str, REWARDS.key] = Field(
        "loglik", description="what scores a candidate: the gold answers' log-likelihood "
        "(loglik; continuous), QA accuracy (supervised; 0/1 per question, candidates often "
        "tie) or the context's own likelihood (intrinsic)")
    lam: float = Field(1.0, ge=0, description="weight of forgetting in the reward")
    qa_metric: QAMetric = Field("f1", description="QA score of the supervised reward")
    forget_window: int = Field(4, ge=0, description="earlier contexts checked for forgetting")
    forget_from: ForgetFrom = Field(
        "recent", description="which earlier contexts: the last forget_window (recent), or "
        "forget_window drawn by seed and position from every earlier context of the stream "
        "(all), so that a long stream's reward sees damage to its first contexts at the same "
        "cost")
    lora: LoraTrainConfig = Field(default_factory=LoraTrainConfig,
                                  description="the inner update of each candidate")
    outer_steps: int = Field(8, ge=1, description="outer (IPO) steps, one stream each")
    ipo_tau: float = Field(0.1, gt=0, description="IPO's regularisation tau")
    ipo_lr: float = Field(5e-5, gt=0, description="AdamW learning rate of the IPO update")
    ipo_epochs: int = Field(2, ge=1, description="passes over the preference buffer per "
                            "outer step")
    ipo_reference: Literal["initial", "step"] = Field(
        "initial", description="IPO's reference: the policy before meta-training, fixed for "
        "every outer step (initial, IPO as specified), or a copy taken at the start of each "
        "outer step (step)")
    pair_buffer: int = Field(512, ge=0, description="preference pairs kept across outer "
                             "steps, newest first (0: only the current step's pairs)")
    diversity: float = Field(0.0, ge=0, description="weight of the constrained-entropy bonus")
    prompt_chars: int = Field(1500, ge=1, description="characters of the context in the "
                              "action prompt")
    together: bool = Field(True, description="train the K candidates in one batch "
                           "(candidates.py)")
    seed: int = Field(0, ge=0, description="seed of samples, draws and LoRA initialisation")

    def check(self, num_layers: int) -> None:
        """Refuse settings that the model at hand cannot take."""
        if self.max_layers > num_layers:
            raise PlasticError(f"max_layers {self.max_layers} exceeds the model's "
                               f"{num_layers} layers")
