"""Unit tests of the kd_ranking API: ECE, temperature scaling, KL / ranking KD losses, distill."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from icml24.kd_ranking import RANKING_KINDS, KLDistillLoss, RankingKDLoss, distill, ece, fit_temperature

# ----------------------------------------------------------------------------------------------- ECE


def _probs_with_conf(conf: list[float], c: int = 4) -> torch.Tensor:
    """Rows whose top class is 0 with probability conf[i], the rest spread evenly."""
    p = torch.tensor(conf, dtype=torch.float64)[:, None]
    rest = (1 - p) / (c - 1)
    return torch.cat([p, rest.expand(-1, c - 1)], dim=1)


def test_ece_all_correct_fully_confident_is_zero():
    p = torch.eye(5, dtype=torch.float64)
    m = ece(p, torch.arange(5))
    assert m.ece == 0.0 and m.ece_over == 0.0 and m.ece_under == 0.0
    assert m.accuracy == 1.0 and m.brier == 0.0 and m.nll == pytest.approx(0.0, abs=1e-12)


def test_ece_one_bin_overconfident():
    # confidence 0.8 everywhere, half correct -> ECE = |0.5 - 0.8| = 0.3, all of it over-confidence
    p = _probs_with_conf([0.8] * 10)
    y = torch.tensor([0] * 5 + [1] * 5)
    m = ece(p, y, n_bins=15)
    assert m.ece == pytest.approx(0.3)
    assert m.ece_over == pytest.approx(0.3) and m.ece_under == 0.0
    assert m.mce == pytest.approx(0.3)
    assert m.confidence == pytest.approx(0.8) and m.accuracy == 0.5


def test_ece_two_bins_over_and_under_split():
    # bin A: conf 0.9, acc 0.5 (over 0.4); bin B: conf 0.4, acc 1.0 (under 0.6); equal weights
    p = _probs_with_conf([0.9, 0.9, 0.4, 0.4])
    y = torch.tensor([0, 1, 0, 0])
    m = ece(p, y, n_bins=10)
    assert m.ece_over == pytest.approx(0.5 * 0.4)
    assert m.ece_under == pytest.approx(0.5 * 0.6)
    assert m.ece == pytest.approx(m.ece_over + m.ece_under)
    assert m.mce == pytest.approx(0.6)


def test_ece_bins_are_right_closed():
    # conf exactly 0.5 with 2 bins falls in the first bin (0, 0.5], 0.75 in the second: two separate bins
    p = _probs_with_conf([0.5, 0.75], c=2)
    y = torch.tensor([0, 1])
    m = ece(p, y, n_bins=2)
    assert m.ece == pytest.approx(0.5 * 0.5 + 0.5 * 0.75)
    # with one bin they pool: |mean conf 0.625 - acc 0.5|
    assert ece(p, y, n_bins=1).ece == pytest.approx(0.125)


def test_ece_logits_and_probs_agree_and_brier_nll_closed_form():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(200, 7, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 7, (200,), generator=g)
    a, b = ece(z, y), ece(z.softmax(1), y)
    assert a.ece == pytest.approx(b.ece, abs=1e-12)
    assert a.nll == pytest.approx(float(F.cross_entropy(z, y)), rel=1e-10)
    assert b.nll == pytest.approx(float(F.cross_entropy(z, y)), rel=1e-8)
    brier = ((z.softmax(1) - F.one_hot(y, 7)) ** 2).sum(1).mean()
    assert a.brier == pytest.approx(float(brier), rel=1e-10)


def test_ece_matches_torchmetrics():
    tm = pytest.importorskip("torchmetrics.classification")
    g = torch.Generator().manual_seed(1)
    for n_bins in (1, 10, 15):
        z = torch.randn(500, 6, generator=g) * 3
        y = torch.randint(0, 6, (500,), generator=g)
        ref = tm.MulticlassCalibrationError(num_classes=6, n_bins=n_bins, norm="l1")(z.softmax(1), y)
        assert ece(z, y, n_bins=n_bins).ece == pytest.approx(float(ref), abs=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_bins": 0}, "n_bins"),
    ({"n_bins": 2.5}, "n_bins"),
])
def test_ece_bad_n_bins(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ece(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), **kwargs)


def test_ece_bad_inputs():
    z = torch.randn(4, 3)
    with pytest.raises(ValueError, match="labels must lie in"):
        ece(z, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="labels must lie in"):
        ece(z, torch.tensor([0, -1, 2, 1]))
    with pytest.raises(ValueError, match="shape"):
        ece(z, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        ece(torch.randn(4), torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        ece(z, torch.zeros(4))
    with pytest.raises(ValueError, match="NaN"):
        ece(torch.full((4, 3), float("nan")), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="not probabilities"):
        ece(z, torch.zeros(4, dtype=torch.long), from_logits=False)
    with pytest.raises(TypeError, match="torch.Tensor"):
        ece([[0.5, 0.5]], torch.zeros(1, dtype=torch.long))


# ------------------------------------------------------------------------------ temperature scaling


@pytest.mark.parametrize("t_true", [0.5, 2.0, 4.0])
def test_fit_temperature_recovers_known_t(t_true):
    g = torch.Generator().manual_seed(2)
    base = torch.randn(20000, 10, generator=g, dtype=torch.float64) * 2.5
    y = torch.multinomial(base.softmax(1), 1, generator=g).squeeze(1)  # labels ~ softmax(base): calibrated
    t_hat = fit_temperature(base / t_true, y)
    assert t_hat == pytest.approx(1.0 / t_true, rel=0.05)
    # and scaling by the fitted T improves calibration of an over-confident set
    over = base * 3.0
    assert ece(over / fit_temperature(over, y), y).ece < 0.5 * ece(over, y).ece


def test_fit_temperature_bad_inputs():
    with pytest.raises(ValueError, match="labels must lie in"):
        fit_temperature(torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 0]))
    with pytest.raises(ValueError, match="bounds"):
        fit_temperature(torch.randn(5, 3), torch.zeros(5, dtype=torch.long), bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match="max_iter"):
        fit_temperature(torch.randn(5, 3), torch.zeros(5, dtype=torch.long), max_iter=0)


# ------------------------------------------------------------------------------------------- losses


def _distinct_logits(b: int, c: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, c, generator=g, dtype=torch.float64)


def _loss_and_grad(loss, s0, t):
    s = s0.clone().requires_grad_(True)
    val = loss(s, t)
    (grad,) = torch.autograd.grad(val, s)
    return val.detach(), grad


CONFIGS = [(k, tk) for k in RANKING_KINDS for tk in (None, 3)]


@pytest.mark.parametrize("kind, top_k", CONFIGS)
def test_ranking_losses_exactly_invariant_to_teacher_scale_and_shift(kind, top_k):
    s0, t = _distinct_logits(16, 9, 0), _distinct_logits(16, 9, 1)
    loss = RankingKDLoss(kind=kind, top_k=top_k, tau_s=2.0)
    v0, g0 = _loss_and_grad(loss, s0, t)
    for kappa, b in itertools.product((0.25, 1.0, 4.0, 0.37), (-3.0, 0.0, 5.0)):
        v, g = _loss_and_grad(loss, s0, kappa * t + b)
        torch.testing.assert_close(v, v0, rtol=0, atol=0)
        torch.testing.assert_close(g, g0, rtol=0, atol=0)
    # also invariant to a non-linear increasing map (softmax probabilities: same order)
    v, g = _loss_and_grad(loss, s0, t.softmax(1))
    torch.testing.assert_close(v, v0, rtol=0, atol=0)
    torch.testing.assert_close(g, g0, rtol=0, atol=0)


def test_kl_loss_is_not_invariant_negative_control():
    s0, t = _distinct_logits(16, 9, 0), _distinct_logits(16, 9, 1)
    loss = KLDistillLoss(tau=4.0)
    v0, g0 = _loss_and_grad(loss, s0, t)
    for kappa in (0.25, 4.0):
        v, g = _loss_and_grad(loss, s0, kappa * t)
        assert abs(float(v - v0)) > 1e-3
        assert float((g - g0).abs().max()) > 1e-4
    # KL is shift-invariant (softmax is), which the ranking invariance must not be confused with
    v, _ = _loss_and_grad(loss, s0, t + 5.0)
    torch.testing.assert_close(v, v0)


def test_kl_loss_matches_reference():
    s, t = _distinct_logits(8, 5, 2), _distinct_logits(8, 5, 3)
    tau = 3.0
    p = (t / tau).softmax(1)
    ref = tau**2 * (p * (p.log() - (s / tau).log_softmax(1))).sum(1).mean()
    torch.testing.assert_close(KLDistillLoss(tau=tau)(s, t), ref)
    ref2 = (p * (p.log() - (s / 1.0).log_softmax(1))).sum(1).mean()
    torch.testing.assert_close(KLDistillLoss(tau=tau, student_tau=1.0, scale_by_tau2=False)(s, t), ref2)


def _pairwise_reference(s, t, top_k, tau_s, kind):
    out = []
    for si, ti in zip(s, t, strict=True):
        order = sorted(range(len(ti)), key=lambda j: -float(ti[j]))
        top = set(order[: (top_k or len(ti))])
        terms = []
        for j in range(len(ti)):
            for k in range(len(ti)):
                if ti[j] > ti[k] and j in top:
                    d = (si[j] - si[k]) / tau_s
                    terms.append(F.softplus(-d) if kind == "pairwise" else 1 - torch.tanh(d))
        out.append(torch.stack(terms).mean())
    return torch.stack(out).mean()


def _listmle_reference(s, t, top_k, tau_s):
    out = []
    for si, ti in zip(s, t, strict=True):
        order = sorted(range(len(ti)), key=lambda j: -float(ti[j]))
        k = top_k or len(ti)
        sp = si[order] / tau_s
        out.append(torch.stack([torch.logsumexp(sp[r:], 0) - sp[r] for r in range(k)]).mean())
    return torch.stack(out).mean()


@pytest.mark.parametrize("kind, top_k", CONFIGS)
def test_ranking_losses_match_slow_reference(kind, top_k):
    s, t = _distinct_logits(5, 6, 4), _distinct_logits(5, 6, 5)
    got = RankingKDLoss(kind=kind, top_k=top_k, tau_s=1.5)(s, t)
    ref = (_listmle_reference(s, t, top_k, 1.5) if kind == "listmle"
           else _pairwise_reference(s, t, top_k, 1.5, kind))
    torch.testing.assert_close(got, ref)


def test_ranking_losses_prefer_the_teacher_order():
    t = _distinct_logits(32, 8, 6)
    for kind in RANKING_KINDS:
        loss = RankingKDLoss(kind=kind)
        assert loss(3 * t, t) < loss(-3 * t, t)  # agreeing order beats reversed order


def test_pairwise_drops_tied_teacher_pairs():
    s = torch.tensor([[0.3, -1.0, 2.0]], dtype=torch.float64)
    t = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)  # classes 0 and 1 tied
    got = RankingKDLoss(kind="pairwise")(s, t)
    ref = (F.softplus(-(s[0, 0] - s[0, 2])) + F.softplus(-(s[0, 1] - s[0, 2]))) / 2
    torch.testing.assert_close(got, ref)


def test_losses_bad_inputs():
    with pytest.raises(ValueError, match="kind must be one of"):
        RankingKDLoss(kind="spearman")
    with pytest.raises(ValueError, match="top_k"):
        RankingKDLoss(top_k=0)
    with pytest.raises(ValueError, match="tau_s"):
        RankingKDLoss(tau_s=0.0)
    with pytest.raises(ValueError, match="tau"):
        KLDistillLoss(tau=0.0)
    with pytest.raises(ValueError, match="tau"):
        KLDistillLoss(tau=-1.0)
    with pytest.raises(ValueError, match="tau"):
        KLDistillLoss(tau=math.inf)
    with pytest.raises(ValueError, match="student_tau"):
        KLDistillLoss(student_tau=0.0)
    s = torch.randn(4, 5)
    with pytest.raises(ValueError, match="top_k"):
        RankingKDLoss(top_k=6)(s, s)
    with pytest.raises(ValueError, match="shape"):
        RankingKDLoss()(s, torch.randn(4, 6))
    with pytest.raises(ValueError, match="shape"):
        KLDistillLoss()(s, torch.randn(3, 5))
    with pytest.raises(ValueError, match="NaN"):
        RankingKDLoss()(s, torch.full((4, 5), float("nan")))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_kl_loss_rejects_non_finite_teacher_logits_like_ranking(bad):
    s = torch.randn(4, 5)
    t = torch.randn(4, 5)
    t[2, 3] = bad
    for loss in (KLDistillLoss(), RankingKDLoss()):
        with pytest.raises(ValueError, match="teacher_logits contain NaN or inf"):
            loss(s, t)


def test_kl_loss_moves_teacher_to_student_device_and_dtype():
    s = torch.randn(4, 5, dtype=torch.float64)
    t = torch.randn(4, 5)  # float32
    got = KLDistillLoss(tau=2.0)(s, t)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, KLDistillLoss(tau=2.0)(s, t.double()))
    if torch.cuda.is_available():
        got_dev = KLDistillLoss(tau=2.0)(s.cuda(), t)  # teacher on the CPU, student on the GPU
        assert got_dev.device == s.cuda().device
        torch.testing.assert_close(got_dev.cpu(), got)


# ------------------------------------------------------------------------------------------ distill


def _toy(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 6, generator=g)
    w = torch.randn(6, 4, generator=g)
    y = (x @ w).argmax(1)
    return x, y, w


def _batches(x, y, t=None, bs=64):
    return [tuple(a[i:i + bs] for a in ((x, y) if t is None else (x, y, t))) for i in range(0, len(x), bs)]


def test_distill_trains_and_is_deterministic():
    x, y, w = _toy()
    teacher = torch.nn.Linear(6, 4)
    with torch.no_grad():
        teacher.weight.copy_(w.T * 3)
        teacher.bias.zero_()

    def run(loss):
        torch.manual_seed(0)
        student = torch.nn.Linear(6, 4)
        hist = distill(student, teacher, _batches(x, y), loss, epochs=15, lr=0.05)
        return student, hist

    for loss in (None, KLDistillLoss(tau=2.0), RankingKDLoss()):
        st, hist = run(loss)
        assert hist["loss"][-1] < hist["loss"][0]
        assert (st(x).argmax(1) == y).float().mean() > 0.9
        st2, _ = run(loss)
        torch.testing.assert_close(st.weight, st2.weight, rtol=0, atol=0)


def test_distill_with_precomputed_logits_equals_online_teacher():
    x, y, w = _toy(1)
    teacher = torch.nn.Linear(6, 4)
    with torch.no_grad():
        t = teacher(x)
    out = []
    for online in (True, False):
        torch.manual_seed(3)
        student = torch.nn.Linear(6, 4)
        if online:
            distill(student, teacher, _batches(x, y), KLDistillLoss(), epochs=2)
        else:
            distill(student, None, _batches(x, y, t), KLDistillLoss(), epochs=2)
        out.append(student.weight.detach().clone())
    torch.testing.assert_close(out[0], out[1])


@pytest.mark.parametrize("mode", [True, False])
def test_distill_restores_the_callers_mode(mode):
    x, y, _ = _toy()
    student = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 4))
    student.train(mode)
    seen = []
    student.register_forward_pre_hook(lambda m, a: seen.append(m.training))
    distill(student, None, _batches(x, y), None, epochs=1)
    assert seen and all(seen)  # trained in train() mode
    assert student.training is mode and all(m.training is mode for m in student.modules())
    student.train(mode)
    with pytest.raises(ValueError, match="labels"):  # restored also when it fails
        distill(student, None, _batches(x, y + 10), None)
    assert student.training is mode


def test_distill_label_and_kd_weight_checks():
    x, y, _ = _toy()
    student = torch.nn.Linear(6, 4)
    with pytest.raises(ValueError, match=r"labels y must be in \[0, 4\)"):
        distill(student, None, _batches(x, torch.where(y == 0, 4, y)), None)
    with pytest.raises(ValueError, match="labels"):
        distill(student, None, _batches(x, y - 1), None)
    with pytest.raises(TypeError, match="labels"):
        distill(student, None, _batches(x, y.float()), None)
    for bad in ("0.5", None, True, [0.5]):
        with pytest.raises(TypeError, match="kd_weight"):
            distill(student, None, _batches(x, y, x[:, :4]), KLDistillLoss(), kd_weight=bad)
    with pytest.raises(ValueError, match="kd_weight"):
        distill(student, None, _batches(x, y, x[:, :4]), KLDistillLoss(), kd_weight=float("nan"))
    before = student.weight.detach().clone()
    with pytest.raises(ValueError, match="labels"):  # checked before any optimizer step
        distill(student, None, _batches(x, y + 4), None)
    torch.testing.assert_close(student.weight, before, rtol=0, atol=0)


def test_distill_bad_inputs():
    x, y, _ = _toy()
    student = torch.nn.Linear(6, 4)
    with pytest.raises(ValueError, match="epochs"):
        distill(student, None, _batches(x, y, x[:, :4]), None, epochs=0)
    with pytest.raises(ValueError, match="kd_weight"):
        distill(student, None, _batches(x, y, x[:, :4]), KLDistillLoss(), kd_weight=1.5)
    with pytest.raises(ValueError, match="lr"):
        distill(student, None, _batches(x, y, x[:, :4]), KLDistillLoss(), lr=0.0)
    with pytest.raises(TypeError, match="student"):
        distill(lambda z: z, None, _batches(x, y), None)
    with pytest.raises(TypeError, match="loss"):
        distill(student, None, _batches(x, y), "kl")
    with pytest.raises(ValueError, match=r"\(x, y, teacher_logits\)"):
        distill(student, None, _batches(x, y), KLDistillLoss())


# ------------------------------------------------------------------ drop-in: top-K memory, tokens, masks, modes
def _topk_pairwise_reference(s, t, k):
    """Pairwise loss row by row over the K top classes only: O(K·C) per row, for any C."""
    out = []
    for si, ti in zip(s, t, strict=True):
        top = torch.argsort(ti, descending=True, stable=True)[:k]
        terms = [F.softplus(-(si[j] - si))[ti[j] > ti] for j in top]
        out.append(torch.cat(terms).mean())
    return torch.stack(out).mean()


def test_top_k_costs_b_k_c_memory_at_ten_thousand_classes():
    from torch.profiler import ProfilerActivity, profile
    b, c, k = 2, 10_000, 8
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(b, c, generator=g, requires_grad=True), torch.randn(b, c, generator=g)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        got = RankingKDLoss(top_k=k)(s, t)
        (grad,) = torch.autograd.grad(got, s)
    peak_op = max(e.cpu_memory_usage for e in prof.events())
    assert peak_op <= 16 * b * k * c  # the largest single allocation; all pairs (B·C² bools) would be 1250× more
    s_ref = s.detach().clone().requires_grad_(True)
    ref = _topk_pairwise_reference(s_ref, t, k)
    (grad_ref,) = torch.autograd.grad(ref, s_ref)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(grad, grad_ref)


def _token_batch(seed=0, b=3, tt=5, vocab=7):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(b, tt, vocab, generator=g, dtype=torch.float64)
    t = torch.randn(b, tt, vocab, generator=g, dtype=torch.float64)
    mask = torch.ones(b, tt, dtype=torch.long)
    mask[0, 3:] = 0  # right padding
    mask[2, :2] = 0  # left padding
    return s, t, mask


LOSSES = [lambda **kw: KLDistillLoss(tau=2.0, **kw)] + [
    (lambda kind, top_k: lambda **kw: RankingKDLoss(kind=kind, top_k=top_k, **kw))(kind, top_k)  # noqa: B023 (bound by the outer lambda)
    for kind in RANKING_KINDS for top_k in (None, 3)]


@pytest.mark.parametrize("make", LOSSES)
def test_token_level_inputs_masks_and_reductions(make):
    s, t, mask = _token_batch()
    keep = mask.bool()
    rows = make()(s[keep], t[keep])  # the (N, V) loss over the kept tokens
    torch.testing.assert_close(make()(s, t, mask=mask), rows)
    labels = torch.randint(0, 5, mask.shape, generator=torch.Generator().manual_seed(1))
    labels[~keep] = -100
    torch.testing.assert_close(make()(s, t, labels=labels), rows)
    torch.testing.assert_close(make(ignore_index=5)(s, t, labels=labels.masked_fill(~keep, 5)), rows)
    n = int(keep.sum())
    torch.testing.assert_close(make(reduction="sum")(s, t, mask=mask), rows * n)
    per_tok = make(reduction="none")(s, t, mask=mask)
    assert per_tok.shape == (3, 5) and torch.all(per_tok[~keep] == 0)
    torch.testing.assert_close(per_tok[keep].mean(), rows)
    torch.testing.assert_close(per_tok[1], make(reduction="none")(s[1], t[1]))  # a row is a token: (B, C) agrees
    # padding with garbage teacher logits neither raises nor poisons the gradient
    t_bad = t.clone()
    t_bad[~keep] = float("nan")
    s_req = s.clone().requires_grad_(True)
    make()(s_req, t_bad, mask=mask).backward()
    assert torch.isfinite(s_req.grad).all() and torch.all(s_req.grad[~keep] == 0)
    with pytest.raises(ValueError, match="teacher_logits contain NaN or inf"):
        make()(s, t_bad)


def test_token_level_bad_inputs():
    s, t, mask = _token_batch()
    for loss in (KLDistillLoss(), RankingKDLoss()):
        with pytest.raises(ValueError, match=r"mask must have shape \(3, 5\)"):
            loss(s, t, mask=mask[:, :4])
        with pytest.raises(TypeError, match="mask must be a bool or integer tensor"):
            loss(s, t, mask=mask.double())
        with pytest.raises(ValueError, match=r"labels must have shape \(3, 5\)"):
            loss(s, t, labels=mask[0])
        with pytest.raises(TypeError, match="labels must be an integer tensor"):
            loss(s, t, labels=mask.float())
        with pytest.raises(ValueError, match=r"shape \(B, C\) or \(B, T, V\)"):
            loss(s[None], t[None])
    for cls in (KLDistillLoss, RankingKDLoss):
        with pytest.raises(ValueError, match="reduction must be one of"):
            cls(reduction="batchmean")
        with pytest.raises(TypeError, match="ignore_index must be an int"):
            cls(ignore_index=-100.0)


@pytest.mark.parametrize("teacher_mode", [True, False])
def test_distill_restores_the_teachers_mode(teacher_mode):
    x, y, w = _toy()
    teacher = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Dropout(0.5))
    teacher.train(teacher_mode)
    teacher[1].train(not teacher_mode)  # a mixed state is restored module by module
    seen = []
    teacher.register_forward_pre_hook(lambda m, a: seen.append(m.training))
    distill(torch.nn.Linear(6, 4), teacher, _batches(x, y), KLDistillLoss(), epochs=1)
    assert seen and not any(seen)  # the teacher ran in eval()
    assert teacher.training is teacher_mode and teacher[1].training is (not teacher_mode)
    with pytest.raises(ValueError, match="labels"):
        distill(torch.nn.Linear(6, 4), teacher, _batches(x, y + 10), KLDistillLoss())
    assert teacher.training is teacher_mode  # restored also when it fails
