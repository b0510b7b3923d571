"""The MQAR experiment's configuration and the sizes a sample fits in: no torch, so the
command line builds ``memory mqar``'s options from it without loading torch."""

from __future__ import annotations

from plasticlm.config import Field, configclass
from plasticlm.errors import PlasticError


def check_mqar_sizes(vocab_size: int, seq_len: int, num_kv: int) -> None:
    """Refuse sizes no MQAR sample fits: too few keys or values, or too few query slots."""
    half = vocab_size // 2
    if num_kv > half - 1 or num_kv > vocab_size - half:
        raise PlasticError(f"vocab_size={vocab_size} has too few keys/values for num_kv={num_kv}")
    slots = (seq_len - 2 * num_kv) // 2
    if slots < num_kv:
        raise PlasticError(f"seq_len={seq_len} leaves room for {slots} queries, fewer than "
                           f"num_kv={num_kv}")


@configclass
class MQARConfig:
    """The recall experiment: a 2-layer tiny Llama trained from scratch on MQAR."""

    steps: int = Field(1000, gt=0, description="training steps of each variant")
    batch: int = Field(32, gt=0, description="examples per step")
    lr: float = Field(3e-3, gt=0, description="peak learning rate "
                      "(one-cycle schedule)")
    seq_len: int = Field(64, gt=0, description="tokens per training example")
    num_kv: int = Field(8, gt=0, description="key-value pairs per training example")
    window: int = Field(8, gt=0, description="softmax window; shorter than the key-value span")
    vocab: int = Field(128, gt=0, description="vocabulary: keys from the lower half, values "
                       "from the upper")
    hidden: int = Field(128, gt=0, description="model width (a multiple of heads)")
    heads: int = Field(4, gt=0, description="attention heads")
    rank: int = Field(8, gt=0, description="LoRA rank of the memory's q/k/v")
    conv: int = Field(4, ge=0, description="short causal convolution on q/k/v; 0 = none")
    eval_every: int = Field(100, gt=0, description="steps between accuracy checks on the "
                            "training curve")
    test_examples: int = Field(512, gt=0, description="fresh examples per test setting")
    seed: int = Field(0, description="seed of the model and the data")
    threads: int = Field(1, gt=0, description="torch CPU threads")
    recurrent: bool = Field(True, description="false: the memory with its recurrence removed "
                            "(a control)")

    def __post_init__(self):
        if self.hidden % self.heads:
            raise PlasticError(f"config hidden={self.hidden} is not a multiple of "
                               f"heads={self.heads}")
        for seq_len, num_kv in self.test_settings():   # every test split can be drawn
            check_mqar_sizes(self.vocab, seq_len, num_kv)

    def test_settings(self) -> list[tuple[int, int]]:
        """(seq_len, num_kv) evaluated after training: as trained, twice the pairs, 4x longer."""
        return [(self.seq_len, self.num_kv), (2 * self.seq_len, 2 * self.num_kv), (4 * self.seq_len, self.num_kv)]
