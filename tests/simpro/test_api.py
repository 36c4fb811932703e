"""SimPro: closed forms and invariants of the method, the data helpers, and bad-input errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from icml24.simpro import (
    DISTRIBUTIONS,
    GaussianMixtureTier,
    SimProLoss,
    bayes_posterior,
    em_prior,
    gaussian_augment,
    kl_divergence,
    make_criterion,
    make_imb_data,
    masked_soft_cross_entropy,
    mnist1d_augment,
    split_labeled_unlabeled,
    train_ssl,
    unlabeled_counts,
)

# notes §2.7: CIFAR-10-LT (N1=500, M1=4000, γ=150), the official lists
CIFAR10 = {
    "labeled": [500, 286, 164, 94, 53, 30, 17, 10, 5, 3],
    "consistent": [4000, 2292, 1313, 752, 431, 247, 141, 81, 46, 26],
    "uniform": [4000] * 10,
    "reversed": [26, 46, 81, 141, 247, 431, 752, 1313, 2292, 4000],
    "middle": [46, 141, 431, 1313, 4000, 2292, 752, 247, 81, 26],
    "head-tail": [2292, 752, 247, 81, 26, 46, 141, 431, 1313, 4000],
}


def test_class_count_lists_match_the_official_ones():
    assert make_imb_data(max_num=500, num_classes=10, gamma=150) == CIFAR10["labeled"]
    assert sum(CIFAR10["labeled"]) == 1162
    for d in DISTRIBUTIONS:
        assert unlabeled_counts(distribution=d, max_num=4000, num_classes=10, gamma=150) == CIFAR10[d], d
    # notes §5.1 / §5.2 toy lists
    assert make_imb_data(max_num=40, num_classes=10, gamma=20) == [40, 28, 20, 14, 10, 7, 5, 3, 2, 2]
    assert make_imb_data(max_num=100, num_classes=10, gamma=10) == [100, 77, 59, 46, 35, 27, 21, 16, 12, 10]


def test_orderings_are_permutations_of_the_descending_list():
    desc = make_imb_data(max_num=300, num_classes=7, gamma=10)
    for d in ("consistent", "reversed", "middle", "head-tail"):
        got = unlabeled_counts(distribution=d, max_num=300, num_classes=7, gamma=10)
        assert sorted(got) == sorted(desc)
    mid = unlabeled_counts(distribution="middle", max_num=300, num_classes=7, gamma=10)
    ht = unlabeled_counts(distribution="head-tail", max_num=300, num_classes=7, gamma=10)
    assert int(np.argmax(mid)) == 3 and max(ht) in (ht[0], ht[-1]) and min(ht) == ht[3]


def test_split_is_disjoint_with_the_requested_counts():
    y = np.repeat(np.arange(4), 50)
    lab, unl = split_labeled_unlabeled(y, labeled=[10, 5, 3, 1], unlabeled=[1, 3, 5, 40], seed=0)
    assert not set(lab) & set(unl)
    assert np.bincount(y[lab], minlength=4).tolist() == [10, 5, 3, 1]
    assert np.bincount(y[unl], minlength=4).tolist() == [1, 3, 5, 40]
    lab2, _ = split_labeled_unlabeled(y, labeled=[10, 5, 3, 1], unlabeled=[1, 3, 5, 40], seed=0)
    assert np.array_equal(lab, lab2)


def test_bayes_posterior_equals_the_analytic_posterior():
    tier = GaussianMixtureTier(num_classes=5, dim=3, data_seed=1)
    x, _ = tier.sample([20] * 5, generator=torch.Generator().manual_seed(0))
    prior = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
    # analytic: π_y N(x; μ_y, I) / Σ_c π_c N(x; μ_c, I), written out with the Gaussian density
    dens = torch.stack([torch.exp(-0.5 * ((x.double() - tier.means[c]) ** 2).sum(1)) / (2 * math.pi) ** 1.5
                        for c in range(5)], 1)
    joint = dens * prior
    torch.testing.assert_close(bayes_posterior(tier.log_likelihood(x), prior), joint / joint.sum(1, keepdim=True))
    # τ scales the log prior: τ = 2 equals the posterior under π² (renormalised)
    p2 = prior**2 / (prior**2).sum()
    torch.testing.assert_close(bayes_posterior(tier.log_likelihood(x), prior, tau=2.0),
                               bayes_posterior(tier.log_likelihood(x), p2), atol=1e-9, rtol=1e-6)


@pytest.mark.parametrize("dist", ["reversed", "head-tail", "middle"])
def test_oracle_em_converges_to_the_true_unlabeled_prior(dist):
    tier = GaussianMixtureTier(data_seed=0, mean_scale=1.2)
    counts = unlabeled_counts(distribution=dist, max_num=1000, num_classes=10, gamma=20)
    x, _ = tier.sample(counts, generator=torch.Generator().manual_seed(1))
    pi_true = torch.tensor(counts, dtype=torch.float64) / sum(counts)
    pi, path = em_prior(tier.log_likelihood(x), iters=500)
    kls = [kl_divergence(pi_true, p) for p in path]
    assert kls[0] > 0.3  # starts far (uniform)
    assert kl_divergence(pi_true, pi) < 0.01
    # the EM fixed point: π = mean posterior under π
    torch.testing.assert_close(bayes_posterior(tier.log_likelihood(x), pi).mean(0), pi, atol=1e-6, rtol=0)


def test_simpro_m_step_with_oracle_likelihoods_tracks_the_true_prior():
    """SimProLoss's own E/M-steps (all samples, EMA 0.5, no +1) reach the EM answer from a uniform init."""
    tier = GaussianMixtureTier(data_seed=0)
    counts = unlabeled_counts(distribution="reversed", max_num=800, num_classes=10, gamma=20)
    x, _ = tier.sample(counts, generator=torch.Generator().manual_seed(2))
    pi_true = torch.tensor(counts, dtype=torch.float64) / sum(counts)
    crit = SimProLoss(num_classes=10, labeled_counts=make_imb_data(max_num=40, num_classes=10, gamma=20), tau=1.0,
                      threshold=0.5, ema_u=0.5, pi_estimate_on="all", plus_one=False)
    ll = tier.log_likelihood(x).float()
    start = kl_divergence(pi_true, crit.pi_u)
    for _ in range(60):
        crit.pseudo_label(ll)
        crit.update_priors()
    assert start > 0.3 and kl_divergence(pi_true, crit.pi_u) < 0.02
    assert abs(float(crit.pi_u.sum()) - 1) < 1e-5


def test_masked_soft_ce_equals_the_manual_formula():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 4, generator=g)
    q = torch.softmax(torch.randn(6, 4, generator=g), 1)
    mask = torch.tensor([1.0, 0, 1, 1, 0, 0])
    manual = sum(-(q[i] * torch.log_softmax(z[i], 0)).sum() * mask[i] for i in range(6)) / 6
    torch.testing.assert_close(masked_soft_cross_entropy(z, q, mask), manual)


def test_loss_equals_the_official_formula():
    g = torch.Generator().manual_seed(0)
    counts = [8, 4, 2, 1]
    crit = SimProLoss(num_classes=4, labeled_counts=counts, tau=2.0, threshold=0.3)
    crit.pi_train.copy_(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    crit.pi_u.copy_(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    crit.adj.copy_(torch.log(crit.pi_train**2 + 1e-12))
    crit.adj_u.copy_(torch.log(crit.pi_u**2 + 1e-12))
    lw, ls = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    y = torch.tensor([0, 1, 2, 3, 0])
    uw, us1, us2 = (torch.randn(7, 4, generator=g) for _ in range(3))
    q, mask = crit.pseudo_label(uw)
    q_ref = torch.softmax(uw + torch.log(crit.pi_u**2 + 1e-12), 1)
    torch.testing.assert_close(q, q_ref)
    assert torch.equal(mask, (q_ref.max(1).values >= 0.3).float())
    loss = crit(logits_l=[lw, ls], y_l=y, logits_u=[us1, us2], q=q, mask=mask, scale_ratio=2.5)
    adj = torch.log(crit.pi_train**2 + 1e-12)
    lx = F.cross_entropy(torch.cat([lw, ls]) + adj, torch.cat([y, y])) / 2.5
    lu = (F.cross_entropy(torch.cat([us1, us2]) + adj, torch.cat([q, q]), reduction="none")
          * torch.cat([mask, mask])).mean()
    torch.testing.assert_close(loss, lx + lu)
    # statistics: labeled counted once per batch, Σ q over confident samples only
    assert crit.count_labeled.tolist() == [2, 1, 1, 1]
    torch.testing.assert_close(crit.sum_q, q_ref[mask.bool()].sum(0))


def test_adjustment_is_frozen_within_a_period_and_updated_by_the_closed_form():
    crit = SimProLoss(num_classes=3, labeled_counts=[6, 3, 1], tau=1.0, threshold=0.5, ema_u=0.9)
    adj0, adju0 = crit.adj.clone(), crit.adj_u.clone()
    logits = torch.tensor([[5.0, 0, 0], [0, 0, 5.0], [0, 0, 6.0], [0.1, 0, 0]])
    for _ in range(3):  # within the period nothing moves
        q, mask = crit.pseudo_label(logits)
        crit(logits_l=[torch.zeros(2, 3)], y_l=torch.tensor([0, 1]))
        assert torch.equal(crit.adj, adj0) and torch.equal(crit.adj_u, adju0)
    s = crit.sum_q.clone()
    lab = crit.count_labeled.clone()
    assert lab.tolist() == [3, 3, 0]
    e = crit.update_priors()
    torch.testing.assert_close(e, s / (s.sum() + 1))  # the official +1
    torch.testing.assert_close(crit.pi_u, 0.9 * torch.full((3,), 1 / 3) + 0.1 * e)
    c = lab + s
    torch.testing.assert_close(crit.pi_train, 0.9 * torch.tensor([0.6, 0.3, 0.1]) + 0.1 * c / c.sum())
    torch.testing.assert_close(crit.adj_u, torch.log(crit.pi_u + 1e-12))
    assert crit.sum_q.sum() == 0 and crit.count_labeled.sum() == 0
    # the priors are buffers: they are checkpointed (the official code loses them on resume)
    sd = crit.state_dict()
    assert {"pi_u", "pi_train", "adj", "adj_u"} <= set(sd)
    fresh = SimProLoss(num_classes=3, labeled_counts=[6, 3, 1], tau=1.0, threshold=0.5)
    fresh.load_state_dict(sd)
    torch.testing.assert_close(fresh.pi_u, crit.pi_u)


def test_pi_estimate_on_all_counts_every_sample():
    logits = torch.tensor([[5.0, 0, 0], [0.1, 0, 0]])
    a = SimProLoss(num_classes=3, labeled_counts=[1, 1, 1], threshold=0.9, pi_estimate_on="all")
    c = SimProLoss(num_classes=3, labeled_counts=[1, 1, 1], threshold=0.9, pi_estimate_on="confident")
    qa, _ = a.pseudo_label(logits)
    c.pseudo_label(logits)
    torch.testing.assert_close(a.sum_q, qa.sum(0))
    torch.testing.assert_close(c.sum_q, qa[0])


def test_baseline_criteria_switches():
    counts = [10, 5, 2]
    fm = make_criterion("fixmatch", num_classes=3, labeled_counts=counts)
    la = make_criterion("fixmatch_la", num_classes=3, labeled_counts=counts, tau=1.0)
    sp = make_criterion("simpro", num_classes=3, labeled_counts=counts)
    z = torch.tensor([[2.0, 1.0, 0.0]])
    q, _ = fm.pseudo_label(z)
    assert q.tolist() == [[1.0, 0.0, 0.0]] and torch.equal(fm.adj, torch.zeros(3))
    torch.testing.assert_close(la.adj_u, torch.log(torch.tensor(counts) / 17.0 + 1e-12))
    qs, _ = sp.pseudo_label(z)
    torch.testing.assert_close(qs, torch.softmax(z, 1))  # π̂_u starts uniform
    for crit in (fm, la):
        before = (crit.pi_u.clone(), crit.adj.clone())
        crit.update_priors()
        assert torch.equal(crit.pi_u, before[0]) and torch.equal(crit.adj, before[1])


def test_train_ssl_runs_and_is_deterministic():
    tier = GaussianMixtureTier(num_classes=3, dim=4, mean_scale=2.0)
    g = torch.Generator().manual_seed(0)
    xl, yl = tier.sample([12, 6, 3], generator=g)
    xu, _ = tier.sample([10, 20, 40], generator=g)

    def go():
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3)
        crit = make_criterion("simpro", num_classes=3, labeled_counts=[12, 6, 3], threshold=0.7)
        return train_ssl(model=m, criterion=crit, x_l=xl, y_l=yl, x_u=xu, augment=gaussian_augment, steps=40,
                         batch_size=4, mu=2, lr=0.1, update_period=10, seed=3,
                         pi_u_true=torch.tensor([1 / 7, 2 / 7, 4 / 7]))

    a, b = go(), go()
    assert len(a["kl_history"]) == 4
    torch.testing.assert_close(a["pi_u_hat"], b["pi_u_hat"])
    for pa, pb in zip(a["ema_model"].parameters(), b["ema_model"].parameters(), strict=True):
        torch.testing.assert_close(pa, pb)


def test_augmentations_shapes_and_strength():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 40)
    w, s = mnist1d_augment(x, strong=False, generator=g), mnist1d_augment(x, strong=True, generator=g)
    assert w.shape == s.shape == x.shape
    assert (s - x).abs().mean() > (w - x).abs().mean()
    assert mnist1d_augment(x[..., None], strong=True, generator=g).shape == (64, 40, 1)
    xg = torch.zeros(100, 5)
    assert gaussian_augment(xg, strong=True, generator=g).std() > gaussian_augment(xg, strong=False, generator=g).std()


# ------------------------------------------------------------------------------------------------ bad input
def _crit(**kw):
    base = dict(num_classes=3, labeled_counts=[4, 2, 1])
    base.update(kw)
    return SimProLoss(**base)


@pytest.mark.parametrize("fn, exc, match", [
    (lambda: make_imb_data(max_num=100, num_classes=10, gamma=0.5), ValueError, "imbalance ratio"),
    (lambda: make_imb_data(max_num=10, num_classes=10, gamma=100), ValueError, "zero samples"),
    (lambda: unlabeled_counts(distribution="skewed", max_num=10, num_classes=3, gamma=2), ValueError, "distribution"),
    (lambda: split_labeled_unlabeled(np.repeat(np.arange(3), 5), labeled=[3, 0, 1], unlabeled=[1, 1, 1], seed=0),
     ValueError, "labeled sample"),
    (lambda: split_labeled_unlabeled(np.repeat(np.arange(2), 5), labeled=[3, 3], unlabeled=[3, 1], seed=0),
     ValueError, "class 0 has 5"),
    (lambda: _crit(labeled_counts=[4, 0, 1]), ValueError, "labeled sample"),
    (lambda: _crit(labeled_counts=[4, 1]), ValueError, "labeled_counts has 2"),
    (lambda: _crit(threshold=1.0), ValueError, "threshold"),
    (lambda: _crit(threshold=0.0), ValueError, "threshold"),
    (lambda: _crit(tau=-1.0), ValueError, "tau"),
    (lambda: _crit(ema_u=1.0), ValueError, "ema_u"),
    (lambda: _crit(pi_estimate_on="some"), ValueError, "pi_estimate_on"),
    (lambda: _crit().pseudo_label(torch.zeros(0, 3)), ValueError, "unlabeled batch is empty"),
    (lambda: _crit().pseudo_label(torch.zeros(2, 4)), ValueError, "4 classes"),
    (lambda: _crit()(logits_l=torch.zeros(2, 3), y_l=torch.tensor([0, 3])), ValueError, r"y_l must lie in \[0, 3\)"),
    (lambda: _crit()(logits_l=torch.zeros(2, 3), y_l=torch.tensor([0.0, 1.0])), TypeError, "y_l"),
    (lambda: _crit()(logits_l=torch.zeros(3, 3), y_l=torch.tensor([0, 1])), ValueError, "multiple"),
    (lambda: _crit()(logits_l=[torch.zeros(2, 3)], y_l=torch.tensor([0, 1]), logits_u=[torch.zeros(2, 3)]),
     ValueError, "q and mask"),
    (lambda: bayes_posterior(torch.zeros(2, 3), torch.ones(4) / 4), ValueError, "prior has 4"),
])
def test_bad_input_raises_before_compute(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn()


def _train(**kw):
    x = torch.randn(10, 2)
    base = dict(model=torch.nn.Linear(2, 3), criterion=_crit(), x_l=x, y_l=torch.tensor([0, 1, 2] * 3 + [0]),
                x_u=torch.randn(8, 2), augment=gaussian_augment, steps=2)
    base.update(kw)
    return train_ssl(**base)


@pytest.mark.parametrize("kw, exc, match", [
    ({"mu": 0}, ValueError, "mu must be an int >= 1"),
    ({"x_u": torch.zeros(0, 2)}, ValueError, "unlabeled set x_u is empty"),
    ({"y_l": torch.tensor([0, 1, 2] * 3 + [5])}, ValueError, r"y_l must lie in \[0, 3\)"),
    ({"steps": 0}, ValueError, "steps"),
    ({"lr": -0.1}, ValueError, "lr"),
    ({"criterion": torch.nn.CrossEntropyLoss()}, TypeError, "SimProLoss"),
])
def test_train_ssl_bad_input(kw, exc, match):
    with pytest.raises(exc, match=match):
        _train(**kw)


def test_update_priors_sums_statistics_over_ranks(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        crit = SimProLoss(num_classes=3, labeled_counts=[6, 3, 1], threshold=0.5, ema_u=0.0, plus_one=False)
        crit.pseudo_label(torch.tensor([[0.0, 0.0, 5.0], [0.0, 5.0, 0.0]]))
        s = crit.sum_q.clone()
        e = crit.update_priors()
        torch.testing.assert_close(e, s / s.sum())
        torch.testing.assert_close(crit.pi_u, e)
    finally:
        dist.destroy_process_group()
