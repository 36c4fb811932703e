"""SimPro: a line-by-line port of the official training loop (LeapLabTHU/SimPro ``SimPro/train.py`` ``train()``)
against ``SimProLoss`` + ``train_ssl`` on the same views: weights, EMA weights and both priors agree."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from icml24.simpro import SimProLoss, train_ssl
from tests.simpro.official_setup import COUNTS, D, K, Recorder, toy_data


def _official_simpro(model0: nn.Module, views, ys, *, epochs, eval_step, threshold, tau, ema_u, lr, wd, ema_decay,
                     total_steps, scale_ratio, py_u):
    """The official ``train()`` re-typed line by line on pre-made views (labeled weak/strong, unlabeled w/s/s1)."""
    model = copy.deepcopy(model0)
    ema = copy.deepcopy(model0)
    num_classes = K
    py_con = torch.tensor(COUNTS, dtype=torch.float32) / sum(COUNTS)
    py_uni = torch.ones(num_classes) / num_classes
    adj = lambda py, tro: torch.log(py ** tro + 1e-12)  # noqa: E731  compute_adjustment_by_py
    no_decay = ["bias", "bn"]
    groups = [{"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
               "weight_decay": wd},
              {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: max(0.0, math.cos(math.pi * 7.0 / 16.0 * float(s) / float(max(1, total_steps)))))
    kl_div = nn.KLDivLoss(reduction="sum")
    adapt_dis, estimated_dis = py_con, py_uni
    kl_estim_log = []
    it = 0
    model.train()
    for _ in range(epochs):
        adjustment_u = adj(estimated_dis, tau)
        adjustment = adj(adapt_dis, tau)
        dis_unlabeled = torch.zeros(num_classes)
        count_labeled_dataset = torch.zeros(num_classes)
        for _ in range(eval_step):
            v = views[5 * it:5 * it + 5]
            l_real = ys[it]
            it += 1
            batch_size = v[0].shape[0]
            inputs = torch.cat((v[0], v[1], v[2], v[3], v[4]))
            targets_l = l_real
            logits = model(inputs)
            logits_l_w, logits_l_s = logits[:batch_size], logits[batch_size:batch_size * 2]
            logits_u_w, logits_u_s, logits_u_s1 = logits[batch_size * 2:].chunk(3)
            pseudo_label = torch.softmax(logits_u_w.detach() + adjustment_u, dim=-1)
            max_probs, _ = torch.max(pseudo_label, dim=-1)
            mask = max_probs.ge(threshold)
            count_labeled_dataset += torch.bincount(targets_l, minlength=num_classes)
            dis_unlabeled += torch.sum(pseudo_label[mask], dim=0)
            mask = mask.float()
            mask_twice = torch.cat([mask, mask], dim=0)
            logits_u_s_twice = torch.cat([logits_u_s, logits_u_s1], dim=0)
            targets_u_twice = torch.cat([pseudo_label, pseudo_label], dim=0)
            logits_l = torch.cat([logits_l_w, logits_l_s], dim=0)
            targets_l = torch.cat([targets_l, targets_l], dim=0)
            lx = F.cross_entropy(logits_l + adjustment, targets_l, reduction="mean") / scale_ratio
            lu = (F.cross_entropy(logits_u_s_twice + adjustment, targets_u_twice, reduction="none")
                  * mask_twice).mean()
            loss = lx + lu
            loss.backward()
            optimizer.step()
            scheduler.step()
            with torch.no_grad():  # ModelEMA.update
                for pe, pm in zip(ema.parameters(), model.parameters(), strict=True):
                    pe.mul_(ema_decay).add_((1.0 - ema_decay) * pm)
            model.zero_grad()
        eps = 1e-12
        est = dis_unlabeled / (dis_unlabeled.sum() + 1)
        estimated_dis = estimated_dis * ema_u + est * (1 - ema_u)
        kl_estim_log.append(float(0.5 * kl_div((est + eps).log(), py_u) + 0.5 * kl_div(py_u.log(), est)))
        count_forward = count_labeled_dataset + dis_unlabeled
        adapt_dis = adapt_dis * ema_u + (count_forward / count_forward.sum()) * (1 - ema_u)
    return model, ema, estimated_dis, adapt_dis


@pytest.mark.parametrize("tau, threshold", [(1.0, 0.5), (2.0, 0.8)])
def test_simpro_equals_a_line_by_line_port_of_the_official_loop(tau, threshold):
    xl, yl, xu = toy_data()
    lab = [(xl[i::5][:4], yl[i::5][:4]) for i in range(5)]
    unl = [xu[i::4][:8] for i in range(4)]
    epochs, period = 4, 6
    steps = epochs * period
    torch.manual_seed(0)
    model = nn.Linear(D, K)
    model0 = copy.deepcopy(model)
    crit = SimProLoss(num_classes=K, labeled_counts=COUNTS, tau=tau, threshold=threshold, ema_u=0.9)
    rec = Recorder()
    pi_u = torch.tensor([3, 6, 12, 24.0]) / 45
    out = train_ssl(model=model, criterion=crit, labeled=lab, unlabeled=unl, augment=rec, steps=steps, lr=0.1,
                    weight_decay=5e-4, update_period=period, ema_decay=0.9, seed=0, pi_u_true=pi_u)
    ys = [lab[i % 5][1] for i in range(steps)]
    ref, ref_ema, ref_u, ref_train = _official_simpro(
        model0, rec.views, ys, epochs=epochs, eval_step=period, threshold=threshold, tau=tau, ema_u=0.9, lr=0.1,
        wd=5e-4, ema_decay=0.9, total_steps=steps, scale_ratio=len(unl) / len(lab), py_u=pi_u)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    for p, q in zip(out["ema_model"].parameters(), ref_ema.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(crit.pi_u, ref_u, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(crit.pi_train, ref_train, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref_u, torch.full((K,), 1 / K), atol=1e-3)  # the estimate moved
