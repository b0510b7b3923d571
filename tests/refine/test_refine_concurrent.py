"""Transmitters are asked at the same time: a multi or t2t answer waits for the slowest
transmitter, not for the sum of them, and gives exactly what asking one after another gives."""

import time

import pytest
import torch

from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.refine import FedRefine, Fuser, Link, Peer
from plasticlm.refine.modes import RefineConfig

pytestmark = pytest.mark.usefixtures("one_thread")

DELAY = 0.4   # seconds each transmitter "spends on the network"


class Slow:
    """A transmitter whose every answer takes ``DELAY`` more seconds (sleeping, as a remote
    peer waits for its reply)."""

    def __init__(self, peer: Peer):
        self.peer, self.name = peer, peer.name

    @property
    def layout(self):
        return self.peer.layout

    def prefill(self, *args, **kwargs):
        time.sleep(DELAY)
        return self.peer.prefill(*args, **kwargs)

    def generate(self, *args, **kwargs):
        time.sleep(DELAY)
        return self.peer.generate(*args, **kwargs)


@pytest.fixture(scope="module")
def system():
    tok = train_bpe_tokenizer(["Q: Which organ does Ofloxin act on? A: liver."] * 20,
                              vocab_size=300)
    torch.manual_seed(0)
    receiver = Peer("receiver", build_tiny("qwen3", vocab_size=len(tok)), tok)
    links = []
    for i, arch in enumerate(("llama", "qwen2")):
        t = Peer(f"t{i}", build_tiny(arch, vocab_size=len(tok)), tok)
        fuser = Fuser.for_pair(receiver.layout, t.layout, rank=4)
        for p in fuser.parameters():         # a fuser that changes the cache
            torch.nn.init.normal_(p, std=0.05)
        links.append(Link(Slow(t), fuser.eval()))   # eval: hard gates, no sampling
    return receiver, links


@pytest.mark.parametrize("mode", ["multi", "t2t"])
def test_transmitters_answer_at_the_same_time_and_the_same_as_one_by_one(system, mode):
    receiver, links = system
    prompt, choices = "Q: Which organ does Ofloxin act on? A:", ["liver", "heart"]
    out, took = {}, {}
    for concurrent in (True, False):
        fr = FedRefine(receiver, links, RefineConfig(concurrent=concurrent,
                                                     t2t_max_new_tokens=2))
        t0 = time.perf_counter()
        out[concurrent] = fr.score(prompt, choices, mode)
        took[concurrent] = time.perf_counter() - t0
    assert out[True].scores == out[False].scores
    assert took[False] >= 2 * DELAY
    assert took[True] < 1.5 * DELAY, f"{took[True]:.2f} s: the transmitters ran one by one"


def test_t2t_reads_one_line_per_transmitter_then_the_prompt_once(system):
    """n transmitters: n background lines (each the prompt stated with that transmitter's
    answer, the form the reading drills teach) and the prompt once at the end."""
    receiver, links = system
    prompt = "Q: Which organ does Ofloxin act on? A:"
    prep = FedRefine(receiver, links, RefineConfig(t2t_max_new_tokens=2)).prepare(prompt, "t2t")
    text = receiver.tokenizer.decode(prep.prompt_ids, skip_special_tokens=True)
    assert len(prep.background) == 2
    assert text.count("Which organ") == 3
    assert text.rstrip().endswith("A:")
