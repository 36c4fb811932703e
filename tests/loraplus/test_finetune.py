"""LoRA+ fine-tuning regime: the 1-D ViT, the transfer task, the arms' trainable parameters, the speed metric."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml24.loraplus.experiment import finetune, make_task, speed_ratio
from icml24.loraplus.finetune import (
    LORA_TARGETS,
    SeqViT,
    finetune_transformer,
    make_transfer_task,
    pretrain,
)


@pytest.fixture(scope="module")
def task():
    return make_transfer_task(seed=0, num_samples=600)


def test_transfer_task_splits_classes_and_reverses_the_target(task):
    assert set(task.ys_train.tolist()) == set(range(5)) and set(task.yt_train.tolist()) == set(range(5))
    plain = make_transfer_task(seed=0, num_samples=600, reverse_target=False)
    torch.testing.assert_close(task.xt_test, plain.xt_test.flip(-1))
    torch.testing.assert_close(task.xs_train, plain.xs_train)
    assert abs(float(task.xs_train.mean())) < 1e-4 and abs(float(task.xs_train.std()) - 1) < 1e-3


def test_seqvit_shapes_and_errors():
    m = SeqViT(dim=16, depth=1, num_heads=4, num_classes=5)
    assert m(torch.randn(3, 40)).shape == (3, 5)
    names = {n.rsplit(".", 1)[-1] for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}
    assert set(LORA_TARGETS) <= names
    with pytest.raises(ValueError, match="divisible by patch"):
        SeqViT(length=40, patch=3)
    with pytest.raises(ValueError, match="depth"):
        SeqViT(depth=0)
    with pytest.raises(ValueError, match="mode"):
        finetune_transformer(m, None, mode="full", lr=1e-3, steps=1, batch_size=2, eval_every=1, seed=0)


def test_arms_train_what_they_should_and_leave_the_backbone_alone(task):
    bb = pretrain(task, dim=16, depth=1, steps=3, lr=1e-3, batch_size=16, seed=0)
    before = {k: t.clone() for k, t in bb.state_dict().items()}
    head = finetune_transformer(bb, task, mode="head", lr=1e-2, steps=10, batch_size=16, eval_every=5, seed=0)
    lora = finetune_transformer(bb, task, mode="lora", lr=1e-2, ratio=16.0, steps=10, batch_size=16, eval_every=5,
                                seed=0)
    for k, t in bb.state_dict().items():
        torch.testing.assert_close(t, before[k], rtol=0, atol=0)
    for c in (head, lora):
        assert c["step"].tolist() == [0, 5, 10]
        assert np.all(np.isfinite(c["val_loss"])) and np.all((c["test_acc"] >= 0) & (c["test_acc"] <= 100))
    # at step 0 both arms are the same pretrained backbone with the same fresh head (BA = 0)
    assert head["test_loss"][0] == pytest.approx(lora["test_loss"][0], rel=1e-5)
    assert head["test_loss"][-1] != lora["test_loss"][-1]


def test_speed_ratio():
    steps = np.arange(0, 110, 10.0)
    lora = {"step": steps, "test_loss": np.linspace(1.0, 0.5, 11)}  # best 0.5 at step 100
    fast = {"step": steps, "test_loss": np.linspace(1.0, 0.0, 11)}  # reaches 0.5 at step 50
    assert speed_ratio(lora, fast) == pytest.approx(0.5)
    never = {"step": steps, "test_loss": np.full(11, 0.9)}
    assert speed_ratio(lora, never) == pytest.approx(1.1)  # counted as T + eval_every


def test_width_law_ratio_below_one_slows_b_and_heldout_is_scored():
    t = make_task(width=16, in_dim=4, n_samples=16, target_rank=2, seed=0, n_heldout=32)
    assert t.h_heldout.shape == (32, 16) and t.y_heldout.shape == (32, 1)
    _, h_small = finetune(t, ratio=0.25, lr=1e-2, rank=2, steps=20, seed=0, heldout=True)
    _, h_one = finetune(t, ratio=1.0, lr=1e-2, rank=2, steps=20, seed=0, heldout=True)
    assert np.isfinite(h_small) and np.isfinite(h_one) and h_small != h_one
    # the training task is unchanged by asking for held-out data
    torch.testing.assert_close(make_task(width=16, in_dim=4, n_samples=16, target_rank=2, seed=0).y, t.y)
