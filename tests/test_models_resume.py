"""Resumable training: an interrupted run continues to the same weights as an uninterrupted
one; a checkpoint of another run is ignored; a finished run leaves no checkpoint."""

import pytest
import torch

from plasticlm.models import build_tiny
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
