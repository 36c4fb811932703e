"""Issue 27's amendment: students trained to convergence on validation, 10 fresh zoos, zoos run in parallel."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from icml24.common.data import load_mnist1d
from icml24.kd_ranking import KLDistillLoss, RankingKDLoss
from icml24.kd_ranking.experiment import Config, train_student

# a noisy student (lr 0.1): its validation accuracy peaks early and then falls, so early stopping triggers
NOISY = dict(student_hidden=(16,), student_lr=0.1, student_max_epochs=12, student_patience=3)


@pytest.fixture(scope="module")
def split():
    return load_mnist1d(seed=0)


def _run(split, loss=None, **changes):
    cfg = Config.quick().replace(**{**NOISY, **changes})
    t = torch.randn(len(split.y_train), 10, generator=torch.Generator().manual_seed(0))
    return train_student(cfg, split, seed=5, teacher_train_logits=t if loss is not None else None, loss=loss,
                         kd_weight=0.5)


@pytest.mark.parametrize("loss", [None, KLDistillLoss(tau=1.0), RankingKDLoss()], ids=["ce", "kl", "rank"])
def test_the_best_validation_checkpoint_is_the_one_returned(split, loss):
    r = _run(split, loss)
    assert 1 <= r["best_epoch"] < r["epochs_run"], "precondition: the noisy student peaks before it stops"
    # the same student stopped at its best epoch (same seed, same batches): bit-identical logits
    at_best = _run(split, loss, student_max_epochs=r["best_epoch"], student_patience=r["best_epoch"])
    assert at_best["epochs_run"] == r["best_epoch"]
    torch.testing.assert_close(r["test_logits"], at_best["test_logits"], rtol=0, atol=0)
    assert r["val_acc"] == at_best["val_acc"]
    # no earlier or later epoch had a higher validation accuracy (the best-so-far of each prefix)
    prefix = [_run(split, loss, student_max_epochs=k, student_patience=k)["val_acc"]
              for k in range(1, r["epochs_run"] + 1)]
    assert max(prefix) == r["val_acc"]
    assert prefix.index(r["val_acc"]) + 1 == r["best_epoch"]  # the first epoch reaching it


def test_a_student_that_stops_improving_stops_after_patience_epochs(split):
    r = _run(split)
    assert r["epochs_run"] == min(NOISY["student_max_epochs"], r["best_epoch"] + NOISY["student_patience"])
    assert r["epochs_run"] < NOISY["student_max_epochs"]
    # patience >= max epochs disables early stopping: every epoch runs, the best checkpoint is still kept
    full = _run(split, student_patience=NOISY["student_max_epochs"])
    assert full["epochs_run"] == NOISY["student_max_epochs"]
    assert full["val_acc"] >= r["val_acc"]
    assert full["best_epoch"] >= r["best_epoch"]


def test_an_improving_student_trains_all_its_epochs(split):
    cfg = Config.quick().replace(student_hidden=(16,), student_max_epochs=3, student_patience=3)
    r = train_student(cfg, split, seed=5, teacher_train_logits=None, loss=None)
    assert r["epochs_run"] == 3 and 1 <= r["best_epoch"] <= 3


def test_full_run_defaults_are_the_declared_amendment():
    cfg = Config()
    assert cfg.seeds == tuple(range(10, 20))  # 10 fresh zoos
    assert not set(cfg.seeds) & set(range(5)), "no pooling with the committed run's zoos 0-4"
    assert 99 not in cfg.seeds, "the timing probe's seed is not a full-run zoo"
    assert cfg.student_max_epochs == 60 and cfg.student_patience == 10
    assert cfg.workers == 2
    assert not hasattr(cfg, "student_epochs")
    q = Config.quick()
    assert q.workers == 1 and q.student_max_epochs <= 5
    help_of = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(Config)}
    for name in ("student_max_epochs", "student_patience", "workers", "seeds"):
        assert help_of[name], name


@pytest.mark.parametrize("changes, match", [
    ({"student_max_epochs": 0}, "student_max_epochs"),
    ({"student_patience": 0}, "student_patience"),
    ({"workers": 0}, "workers"),
])
def test_amendment_fields_are_validated(changes, match):
    with pytest.raises(ValueError, match=match):
        Config.quick().replace(**changes)


def test_zoos_give_the_same_numbers_in_two_processes(tmp_path):
    from icml24.kd_ranking.experiment import run
    cfg = Config.quick().replace(teacher_channels=(4, 8), teacher_epochs=1, student_hidden=(8,), student_max_epochs=2,
                                 student_patience=1, kl_taus=(0.5, 1.0, 2.0), rank_tau_s=(0.5, 1.0, 2.0),
                                 grid_extra=0, n_permutations=9)
    one = run(cfg, tmp_path / "one")
    two = run(cfg.replace(workers=2), tmp_path / "two")
    assert one.per_seed == two.per_seed
    assert one.extra["tuned"] == two.extra["tuned"]
    assert one.extra["student_convergence"] == two.extra["student_convergence"]
    n = {arm: v["n_students"] for arm, v in one.extra["student_convergence"].items()}
    # every student trained is counted: 2 zoos × 2 teachers × 3 temperatures × 1 λ per tuned arm (no extension)
    assert n == {"ce": 2, "kl": 12, "rank": 12, "rank_shuffled": 4, "rank_invariance": 4, "kl_invariance": 4}
