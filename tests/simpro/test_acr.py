"""ACR (the baseline): a line-by-line port of the official training loop (Gank0078/ACR ``train.py``) against
``ACRLoss`` + ``train_ssl``, the estimate's equation, the two-head wrapper and bad input."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from icml24.common.nets import ConvNet1D
from icml24.simpro import make_criterion, train_ssl
from icml24.simpro.acr import ACRLoss, DualHeadNet, dual_head, symmetric_kl
from tests.simpro.official_setup import COUNTS, D, K, Recorder, toy_data


def _official_acr(model0: DualHeadNet, views: list[torch.Tensor], ys: list[torch.Tensor], *, epochs: int,
                  eval_step: int, threshold: float, tau1: float, tau12: float, tau2: float, ema_u: float,
                  est_epoch: int, lr: float, wd: float, ema_decay: float, total_steps: int):
    """The official ``train()`` of ACR (Gank0078/ACR train.py), re-typed line by line for a two-head linear model
    (``classify`` = f, ``classify1`` = g) on pre-made views; returns the model, the EMA model, u_py and the τ's."""
    model = copy.deepcopy(model0)
    ema = copy.deepcopy(model0)
    num_classes = K
    py_con = torch.tensor(COUNTS, dtype=torch.float32) / sum(COUNTS)  # compute_py
    py_uni = torch.ones(num_classes) / num_classes
    py_rev = torch.flip(py_con, dims=[0])
    adj = lambda py, tro: torch.log(py ** tro + 1e-12)  # noqa: E731  compute_adjustment_by_py
    adjustment_l1, adjustment_l12, adjustment_l2 = adj(py_con, tau1), adj(py_con, tau12), adj(py_con, tau2)
    taumin, taumax = 0, tau1
    no_decay = ["bias", "bn"]
    groups = [{"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
               "weight_decay": wd},
              {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: max(0.0, math.cos(math.pi * 7.0 / 16.0 * float(s) / float(max(1, total_steps)))))
    u_py = torch.ones(num_classes) / num_classes
    kl_div = nn.KLDivLoss(reduction="sum")
    taus = []
    count_kl = torch.zeros(3)
    it = 0
    model.train()
    for epoch in range(epochs):
        if epoch > est_epoch:
            count_kl = count_kl / eval_step
            kl_softmax = torch.exp(count_kl[0]) / (torch.exp(count_kl[0]) + torch.exp(count_kl[1])
                                                   + torch.exp(count_kl[2]))
            tau = taumin + (taumax - taumin) * kl_softmax
            if not math.isnan(tau):
                adjustment_l1 = adj(py_con, tau)
            taus.append(float(tau))
        count_kl = torch.zeros(3)
        for _ in range(eval_step):
            v = views[5 * it:5 * it + 5]
            inputs_x, targets_x = v[0], ys[it]
            inputs_u_w, inputs_u_s, inputs_u_s1 = v[2], v[3], v[4]
            it += 1
            batch_size = inputs_x.shape[0]
            inputs = torch.cat((inputs_x, inputs_u_w, inputs_u_s, inputs_u_s1))
            feat = model.body(inputs)
            logits = model.head(feat)  # model.classify
            logits_x = logits[:batch_size]
            logits_u_w, logits_u_s, logits_u_s1 = logits[batch_size:].chunk(3)
            lx = F.cross_entropy(logits_x, targets_x, reduction="mean")
            logits_b = model.head_b(feat)  # model.classify1
            logits_x_b = logits_b[:batch_size]
            logits_u_w_b, logits_u_s_b, logits_u_s1_b = logits_b[batch_size:].chunk(3)
            lx_b = F.cross_entropy(logits_x_b + adjustment_l2, targets_x, reduction="mean")
            pseudo_label = torch.softmax(logits_u_w.detach() - adjustment_l1, dim=-1)
            pseudo_label_h2 = torch.softmax(logits_u_w.detach() - adjustment_l12, dim=-1)
            pseudo_label_b = torch.softmax(logits_u_w_b.detach(), dim=-1)
            pseudo_label_t = torch.softmax(logits_u_w.detach(), dim=-1)
            max_probs, targets_u = torch.max(pseudo_label, dim=-1)
            max_probs_h2, targets_u_h2 = torch.max(pseudo_label_h2, dim=-1)
            max_probs_b, targets_u_b = torch.max(pseudo_label_b, dim=-1)
            max_probs_t, _ = torch.max(pseudo_label_t, dim=-1)
            mask = max_probs.ge(threshold)
            mask_h2 = max_probs_h2.ge(threshold)
            mask_b = max_probs_b.ge(threshold)
            mask_t = max_probs_t.ge(threshold)
            mask_ss_b_h2 = (mask_b + mask_h2).float()
            mask_ss_t = (mask + mask_t).float()
            mask_b = mask_b.float()
            mask_twice_ss_b_h2 = torch.cat([mask_ss_b_h2, mask_ss_b_h2], dim=0)
            mask_twice_ss_t = torch.cat([mask_ss_t, mask_ss_t], dim=0)
            logits_u_s_twice = torch.cat([logits_u_s, logits_u_s1], dim=0)
            targets_u_twice = torch.cat([targets_u, targets_u], dim=0)
            targets_u_h2_twice = torch.cat([targets_u_h2, targets_u_h2], dim=0)
            logits_u_s_b_twice = torch.cat([logits_u_s_b, logits_u_s1_b], dim=0)
            now_mask = torch.zeros(num_classes)
            mask_l = torch.ones(len(inputs_u_w), dtype=torch.bool)
            if epoch > est_epoch:
                now_mask[targets_u_b] += mask_l * mask_b
                if now_mask.sum() > 0:
                    now_mask = now_mask / now_mask.sum()
                    u_py = ema_u * u_py + (1 - ema_u) * now_mask
                    kl_con = 0.5 * kl_div(py_con.log(), u_py) + 0.5 * kl_div(u_py.log(), py_con)
                    kl_uni = 0.5 * kl_div(py_uni.log(), u_py) + 0.5 * kl_div(u_py.log(), py_uni)
                    kl_rev = 0.5 * kl_div(py_rev.log(), u_py) + 0.5 * kl_div(u_py.log(), py_rev)
                    count_kl[0] = count_kl[0] + kl_con
                    count_kl[1] = count_kl[1] + kl_uni
                    count_kl[2] = count_kl[2] + kl_rev
            lu = (F.cross_entropy(logits_u_s_twice, targets_u_twice, reduction="none") * mask_twice_ss_t).mean()
            lu_b = (F.cross_entropy(logits_u_s_b_twice, targets_u_h2_twice, reduction="none")
                    * mask_twice_ss_b_h2).mean()
            loss = lx + lu + lx_b + lu_b
            loss.backward()
            optimizer.step()
            scheduler.step()
            with torch.no_grad():  # ModelEMA.update
                for pe, pm in zip(ema.parameters(), model.parameters(), strict=True):
                    pe.mul_(ema_decay).add_((1.0 - ema_decay) * pm)
            model.zero_grad()
    return model, ema, u_py, taus


@pytest.mark.parametrize("threshold", [0.6, 0.9])
def test_acr_equals_a_line_by_line_port_of_the_official_loop(threshold):
    """4 periods of 6 steps; the estimate starts after period 1, so τ̂ is refreshed twice (once from an empty
    period, as the official code does); weights, EMA weights, π̂_u and the τ̂ sequence agree."""
    xl, yl, xu = toy_data()
    epochs, period, est = 4, 6, 1
    steps = epochs * period
    torch.manual_seed(0)
    model = dual_head(nn.Linear(D, K))
    model0 = copy.deepcopy(model)
    crit = ACRLoss(num_classes=K, labeled_counts=COUNTS, tau1=2.0, tau12=1.5, tau2=1.0, threshold=threshold,
                   ema_u=0.9, est_start=est, official_index_put=True)
    rec = Recorder()
    taus: list[float] = []

    orig = crit.update_priors

    def logged():
        e = orig()
        if crit.estimating:
            taus.append(float(crit.tau_hat))
        return e

    crit.update_priors = logged  # type: ignore[method-assign]
    lab_batches = [(xl[i % 5::5][:4], yl[i % 5::5][:4]) for i in range(5)]
    unl_batches = [xu[i % 4::4][:8] for i in range(4)]
    out = train_ssl(model=model, criterion=crit, labeled=lab_batches, unlabeled=unl_batches, augment=rec,
                    steps=steps, lr=0.1, weight_decay=5e-4, update_period=period, ema_decay=0.9, seed=0)
    ys = [lab_batches[i % 5][1] for i in range(steps)]
    ref, ref_ema, ref_u, ref_taus = _official_acr(
        model0, rec.views, ys, epochs=epochs, eval_step=period, threshold=threshold, tau1=2.0, tau12=1.5, tau2=1.0,
        ema_u=0.9, est_epoch=est, lr=0.1, wd=5e-4, ema_decay=0.9, total_steps=steps)
    assert len(rec.views) == 5 * steps
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)
    for p, q in zip(out["ema_model"].parameters(), ref_ema.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(crit.pi_u, ref_u, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref_u, torch.full((K,), 1 / K))  # the estimate moved
    # the official loop refreshes τ at epochs 2, 3 (> est_epoch); ours after periods 2, 3 (the last update is
    # the run's end, which the official loop never reaches)
    assert len(taus) == len(ref_taus) + 1
    torch.testing.assert_close(torch.tensor(taus[:-1]), torch.tensor(ref_taus), rtol=1e-5, atol=1e-6)
    assert abs(ref_taus[0] - 2.0 / 3) < 1e-6  # the first refresh sees an empty period: τ = τ1/3


def test_estimate_is_the_normalised_count_of_confident_balanced_pseudo_labels():
    crit = ACRLoss(num_classes=3, labeled_counts=[4, 2, 1], threshold=0.6, ema_u=0.5, est_start=0)
    crit.updates = 1  # estimating
    g_w = torch.tensor([[5.0, 0, 0], [4.0, 0, 0], [0, 3.0, 0], [0, 0, 0.1], [6.0, 0, 0]])  # 3 conf. class 0, 1 class 1
    z = torch.zeros(5, 3)
    crit(f_l=torch.zeros(2, 3), g_l=torch.zeros(2, 3), y_l=torch.tensor([0, 1]), f_u_w=z, g_u_w=g_w,
         f_u_s=[z, z], g_u_s=[z, z])
    expect = 0.5 * torch.full((3,), 1 / 3) + 0.5 * torch.tensor([0.75, 0.25, 0.0])
    torch.testing.assert_close(crit.pi_u, expect)
    # the official index-put keeps one write per class: class 0 counts once
    off = ACRLoss(num_classes=3, labeled_counts=[4, 2, 1], threshold=0.6, ema_u=0.5, est_start=0,
                  official_index_put=True)
    off.updates = 1
    off(f_l=torch.zeros(2, 3), g_l=torch.zeros(2, 3), y_l=torch.tensor([0, 1]), f_u_w=z, g_u_w=g_w,
        f_u_s=[z, z], g_u_s=[z, z])
    torch.testing.assert_close(off.pi_u, 0.5 * torch.full((3,), 1 / 3) + 0.5 * torch.tensor([0.5, 0.5, 0.0]))
    # KL statistics: one step's symmetric KL to each anchor
    torch.testing.assert_close(crit.count_kl[1], symmetric_kl(torch.full((3,), 1 / 3), crit.pi_u))
    # before est_start nothing moves
    idle = ACRLoss(num_classes=3, labeled_counts=[4, 2, 1], threshold=0.6, est_start=2)
    idle(f_l=torch.zeros(2, 3), g_l=torch.zeros(2, 3), y_l=torch.tensor([0, 1]), f_u_w=z, g_u_w=g_w,
         f_u_s=[z], g_u_s=[z])
    assert torch.equal(idle.pi_u, torch.full((3,), 1 / 3)) and idle.count_kl.sum() == 0


def test_adaptive_tau_follows_the_kl_softmax_and_the_losses_are_the_equations():
    crit = ACRLoss(num_classes=3, labeled_counts=[4, 2, 1], tau1=2.0, tau12=1.0, tau2=0.5, threshold=0.7,
                   est_start=0)
    crit.count_kl.copy_(torch.tensor([3.0, 0.6, 1.5]))
    crit.period_steps = 3
    crit.update_priors()
    d = torch.tensor([1.0, 0.2, 0.5])
    tau = 2.0 * torch.exp(d[0]) / torch.exp(d).sum()
    torch.testing.assert_close(crit.tau_hat, tau)
    pi_l = torch.tensor([4.0, 2, 1]) / 7
    torch.testing.assert_close(crit.adj_1, torch.log(pi_l ** tau + 1e-12))
    assert crit.count_kl.sum() == 0 and crit.period_steps == 0
    g = torch.Generator().manual_seed(1)
    fl, gl = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    y = torch.tensor([0, 1, 2, 0])
    fw, gw = 3 * torch.randn(6, 3, generator=g), 3 * torch.randn(6, 3, generator=g)
    fs = [torch.randn(6, 3, generator=g) for _ in range(2)]
    gs = [torch.randn(6, 3, generator=g) for _ in range(2)]
    loss = crit(f_l=fl, g_l=gl, y_l=y, f_u_w=fw, g_u_w=gw, f_u_s=fs, g_u_s=gs)
    a1, a12, a2 = (torch.log(pi_l ** t + 1e-12) for t in (tau, 1.0, 0.5))
    p1, p12 = torch.softmax(fw - a1, 1), torch.softmax(fw - a12, 1)
    m = ((p1.max(1).values >= 0.7) | (torch.softmax(fw, 1).max(1).values >= 0.7)).float()
    mb = ((p12.max(1).values >= 0.7) | (torch.softmax(gw, 1).max(1).values >= 0.7)).float()
    lu = sum((F.cross_entropy(s, p1.argmax(1), reduction="none") * m).sum() for s in fs) / 12
    lub = sum((F.cross_entropy(s, p12.argmax(1), reduction="none") * mb).sum() for s in gs) / 12
    manual = F.cross_entropy(fl, y) + F.cross_entropy(gl + a2, y) + lu + lub
    torch.testing.assert_close(loss, manual)


def test_dual_head_shares_the_backbone_and_predicts_with_the_balanced_head():
    torch.manual_seed(0)
    net = ConvNet1D()
    dh = dual_head(net)
    x = torch.randn(3, 40)
    f, g = dh.forward_both(x)
    torch.testing.assert_close(f, net(x))
    torch.testing.assert_close(dh(x), g)
    assert not torch.allclose(f, g)
    names = {n for n, _ in dh.named_parameters()}
    assert "head_b.weight" in names and sum(p.numel() for p in dh.parameters()) == (
        sum(p.numel() for p in net.parameters()) + net.head.weight.numel() + net.head.bias.numel())
    lin = nn.Linear(5, 3)
    torch.testing.assert_close(dual_head(lin).forward_both(torch.ones(2, 5))[0], lin(torch.ones(2, 5)))
    with pytest.raises(TypeError, match="cannot split"):
        dual_head(nn.ReLU())


def test_acr_arm_trains_deterministically_and_errors():
    xl, yl, xu = toy_data(1)

    def go():
        torch.manual_seed(0)
        m = dual_head(nn.Linear(D, K))
        crit = make_criterion("acr", num_classes=K, labeled_counts=COUNTS, threshold=0.7, acr_est_start=0)
        return train_ssl(model=m, criterion=crit, x_l=xl, y_l=yl, x_u=xu, augment=Recorder(), steps=20,
                         batch_size=4, mu=2, lr=0.1, update_period=5, seed=1,
                         pi_u_true=torch.tensor([3, 6, 12, 24.0]) / 45)

    a, b = go(), go()
    assert len(a["kl_history"]) == 4
    torch.testing.assert_close(a["pi_u_hat"], b["pi_u_hat"])
    crit = make_criterion("acr", num_classes=K, labeled_counts=COUNTS)
    with pytest.raises(TypeError, match="dual_head"):
        train_ssl(model=nn.Linear(D, K), criterion=crit, x_l=xl, y_l=yl, x_u=xu, augment=Recorder(), steps=2)
    with pytest.raises(ValueError, match="needs unlabeled"):
        train_ssl(model=dual_head(nn.Linear(D, K)), criterion=crit, x_l=xl, y_l=yl, x_u=None, augment=Recorder(),
                  steps=2)
    with pytest.raises(ValueError, match="threshold"):
        ACRLoss(num_classes=K, labeled_counts=COUNTS, threshold=1.0)
    with pytest.raises(ValueError, match="labeled_counts"):
        ACRLoss(num_classes=K, labeled_counts=[1, 2])
    z = torch.zeros(3, K)
    with pytest.raises(ValueError, match="strong views"):
        crit(f_l=z, g_l=z, y_l=torch.tensor([0, 1, 2]), f_u_w=z, g_u_w=z, f_u_s=[], g_u_s=[])
    with pytest.raises(ValueError, match=r"y_l must lie"):
        crit(f_l=z, g_l=z, y_l=torch.tensor([0, 1, 9]), f_u_w=z, g_u_w=z, f_u_s=[z], g_u_s=[z])
