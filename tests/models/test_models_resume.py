"""Resumable training: an interrupted run continues to the same weights as an uninterrupted
one; a checkpoint of another run is ignored; a finished run leaves no checkpoint; batches
packed afresh at every step are a function of the step alone."""

import random

import pytest
import torch

from plasticlm.models import (
    build_tiny,
    packed_batch,
    pretrain,
    train_bpe_tokenizer,
    train_lm_repacked,
)
from plasticlm.models.pretrain import lm_loss, step_generator, train_steps

SIZES = dict(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
             head_dim=8, intermediate_size=32)
BLOCKS = torch.randint(0, 64, (32, 17), generator=torch.Generator().manual_seed(0))


class Interrupt(Exception):
    pass


def _run(folder=None, stop_at=None, key="a", steps=20, calls=None):
    model = build_tiny("llama", seed=1, **SIZES)

    def loss_at(step):
        if calls is not None:
            calls.append(step)
        if step == stop_at:
            raise Interrupt
        idx = torch.randint(len(BLOCKS), (4,), generator=step_generator(0, step))
        return lm_loss(model, BLOCKS[idx])

    losses = train_steps(model, loss_at, steps, lr=1e-2, warmup=3, progress=False,
                         checkpoint=folder, checkpoint_every=5, checkpoint_key=key)
    return model, losses


def _params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_interrupted_run_resumes_to_the_same_weights(tmp_path):
    full, full_losses = _run()
    with pytest.raises(Interrupt):
        _run(tmp_path / "ckpt", stop_at=13)
    assert (tmp_path / "ckpt" / "meta.json").exists()
    calls = []
    resumed, losses = _run(tmp_path / "ckpt", calls=calls)
    # Steps 0-9 come from the checkpoint; only 10-19 run again.
    assert calls == list(range(10, 20))
    assert losses == pytest.approx(full_losses, abs=1e-5)
    assert torch.allclose(_params(resumed), _params(full), atol=1e-5)
    assert not (tmp_path / "ckpt").exists()


def test_checkpoint_of_another_run_is_ignored(tmp_path):
    with pytest.raises(Interrupt):
        _run(tmp_path / "ckpt", stop_at=13, key="a")
    calls = []
    other, losses = _run(tmp_path / "ckpt", key="b", calls=calls)
    assert calls == list(range(20))
    full, full_losses = _run(key="b")
    assert losses == pytest.approx(full_losses, abs=1e-5)


def test_interrupted_swap_falls_back_to_a_complete_folder(tmp_path):
    with pytest.raises(Interrupt):
        _run(tmp_path / "ckpt", stop_at=13)
    # A crash between the two renames leaves only the older folder.
    (tmp_path / "ckpt").rename(tmp_path / "ckpt.old")
    calls = []
    resumed, losses = _run(tmp_path / "ckpt", calls=calls)
    assert calls[0] == 10
    full, full_losses = _run()
    assert losses == pytest.approx(full_losses, abs=1e-5)


DOCS = [f"Document {i} says {'ab' * (i % 5 + 1)} and ends here." for i in range(30)]


def test_repacked_batches_are_fresh_each_draw_and_repeat_for_the_same_draw():
    tok = train_bpe_tokenizer(DOCS * 4, vocab_size=300)
    a = packed_batch(tok, DOCS, 4, 32, random.Random(5))
    assert a.shape == (4, 33)
    assert torch.equal(a, packed_batch(tok, DOCS, 4, 32, random.Random(5)))
    assert not torch.equal(a, packed_batch(tok, DOCS, 4, 32, random.Random(6)))
    # Blocks are consecutive pieces of one stream: each target row ends where the next begins.
    assert torch.equal(a[:-1, -1], a[1:, 0])
    marked = packed_batch(tok, DOCS, 4, 32, random.Random(5), augment=lambda d, r: d.upper())
    assert "DOCUMENT" in tok.decode(marked.flatten()) and "Document" not in tok.decode(
        marked.flatten())


class AugmentInterrupt(Exception):
    pass


def _repacked(folder=None, fail_after=None, seed=0, batches=None):
    """A 20-step repacked run; ``batches`` collects each step's batch, ``fail_after`` stops
    it inside a step after that many augmented documents."""
    tok = train_bpe_tokenizer(DOCS * 4, vocab_size=300)
    model = build_tiny("llama", seed=1, **{**SIZES, "vocab_size": len(tok)})
    calls = [0]

    def augment(doc, rng):
        calls[0] += 1
        if fail_after is not None and calls[0] > fail_after:
            raise AugmentInterrupt
        return doc

    def recorded(*args, **kwargs):
        batch = packed_batch(*args, **kwargs)
        if batches is not None:
            batches.append(batch)
        return batch

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pretrain, "packed_batch", recorded)
        losses = train_lm_repacked(model, tok, DOCS, 20, seq_len=16, batch_size=4, lr=1e-2,
                                   warmup=3, seed=seed, augment=augment, progress=False,
                                   checkpoint=folder, checkpoint_every=5, checkpoint_key="r")
    return model, losses


def test_repacked_training_draws_fresh_batches_learns_and_resumes(tmp_path):
    batches = []
    full, full_losses = _repacked(batches=batches)
    assert len(batches) == 20
    assert all(not torch.equal(a, b) for a, b in zip(batches, batches[1:]))
    assert sum(full_losses[-3:]) < 0.8 * sum(full_losses[:3])
    _, other_seed = _repacked(seed=1)
    assert other_seed != full_losses
    with pytest.raises(AugmentInterrupt):
        _repacked(tmp_path / "ckpt", fail_after=90)   # ~7 documents a step: in step 13
    assert (tmp_path / "ckpt" / "meta.json").exists()
    again = []
    resumed, losses = _repacked(tmp_path / "ckpt", batches=again)
    # Steps 0-9 come from the checkpoint; steps 10-19 draw the batches they drew before.
    assert len(again) == 10 and all(torch.equal(a, b) for a, b in zip(again, batches[10:]))
    assert losses == pytest.approx(full_losses, abs=1e-5)
    assert torch.allclose(_params(resumed), _params(full), atol=1e-5)
    assert not (tmp_path / "ckpt").exists()
