"""SimPro (issue 27): a resumed run equals the uninterrupted one (the M-step counter is checkpointed), and
``train_ssl`` takes DataLoaders / iterables of batches with the tensor path's numbers and clear errors."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from icml24.simpro import GaussianMixtureTier, SimProLoss, gaussian_augment, make_criterion, train_ssl

K, COUNTS_L, COUNTS_U = 3, [12, 6, 3], [10, 20, 40]


def _data():
    tier = GaussianMixtureTier(num_classes=K, dim=4, mean_scale=2.0)
    g = torch.Generator().manual_seed(0)
    xl, yl = tier.sample(COUNTS_L, generator=g)
    xu, _ = tier.sample(COUNTS_U, generator=g)
    return xl, yl, xu


# ------------------------------------------------------------------------------------------ resume (updates)
def _loop(model, opt, crit, g, steps, *, start=0, period=4):
    """The README's loop; the lr halves with every M-step (a schedule read from ``crit.updates``)."""
    xl, yl, xu = _data()
    for step in range(start, steps):
        for group in opt.param_groups:
            group["lr"] = 0.2 * 0.5 ** crit.updates
        il, iu = torch.randint(len(xl), (6,), generator=g), torch.randint(len(xu), (12,), generator=g)
        logits = model(torch.cat([xl[il], xl[il] + 0.3, xu[iu], xu[iu] + 0.3]))
        l_w, l_s, u_w, u_s = logits.split([6, 6, 12, 12])
        q, mask = crit.pseudo_label(u_w)
        loss = crit(logits_l=[l_w, l_s], y_l=yl[il], logits_u=[u_s], q=q, mask=mask, scale_ratio=2.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % period == 0:
            crit.update_priors()


def _fresh():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, K)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, nesterov=True)
    crit = SimProLoss(num_classes=K, labeled_counts=COUNTS_L, tau=1.0, threshold=0.6)
    return model, opt, crit, torch.Generator().manual_seed(1)


def test_interrupted_and_resumed_run_equals_the_uninterrupted_run(tmp_path):
    full = _fresh()
    _loop(*full, 14)
    assert full[2].updates == 3

    part = _fresh()
    _loop(*part, 7)  # interrupted mid-period (after the first M-step at step 4)
    assert part[2].updates == 1 and part[2].sum_q.sum() > 0
    model, opt, crit, g = part
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "crit": crit.state_dict(),
                "rng": g.get_state()}, tmp_path / "ckpt.pt")
    del part, model, opt, crit, g

    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    model, opt, crit, g = _fresh()
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    crit.load_state_dict(ckpt["crit"])
    g.set_state(ckpt["rng"])
    assert crit.updates == 1  # restored, not restarted at 0
    _loop(model, opt, crit, g, 14, start=7)

    assert crit.updates == full[2].updates
    for a, b in zip(full[0].parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for name, buf in full[2].state_dict().items():
        if isinstance(buf, torch.Tensor):
            torch.testing.assert_close(crit.state_dict()[name], buf, rtol=0, atol=0, equal_nan=True)


def test_updates_is_in_the_state_dict_and_bad_extra_state_is_refused():
    crit = SimProLoss(num_classes=K, labeled_counts=COUNTS_L)
    for _ in range(3):
        crit.update_priors()
    sd = crit.state_dict()
    assert sd["_extra_state"] == {"updates": 3}
    fresh = SimProLoss(num_classes=K, labeled_counts=COUNTS_L)
    fresh.load_state_dict(sd)
    assert fresh.updates == 3
    for bad in ({"updates": -1}, {"updates": 2.0}, {"updates": True}, {}, 3):
        with pytest.raises(ValueError, match="_extra_state must be"):
            fresh.load_state_dict({**sd, "_extra_state": bad})
    assert fresh.updates == 3


# ------------------------------------------------------------------------------------------ DataLoader path
def _aug(x, *, strong, generator):
    """A deterministic augmentation: with it the batch order is the only use of the seed's generator."""
    return x * 0.5 + 0.25 if strong else x


class _Recorder:
    def __init__(self):
        self.seen = []

    def __call__(self, x, *, strong, generator):
        self.seen.append(x.clone())
        return _aug(x, strong=strong, generator=generator)


class _EpochBatches:
    """A batch sampler replaying recorded index batches, ``per_pass`` of them per pass (like a shuffled sampler)."""

    def __init__(self, batches, per_pass):
        self.batches, self.per_pass, self.passes = batches, per_pass, 0

    def __len__(self):
        return self.per_pass

    def __iter__(self):
        start = self.passes * self.per_pass
        self.passes += 1
        return iter(self.batches[start:start + self.per_pass])


def _rows(batch, pool):
    """Indices of ``batch``'s rows in ``pool`` (rows are distinct Gaussian draws)."""
    hit = (batch[:, None, :] == pool[None, :, :]).all(-1)
    assert (hit.sum(1) == 1).all()
    return hit.float().argmax(1).tolist()


def _run(method="simpro", steps=40, **data):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, K))
    crit = make_criterion(method, num_classes=K, labeled_counts=COUNTS_L, threshold=0.7)
    out = train_ssl(model=m, criterion=crit, steps=steps, lr=0.1, update_period=10, seed=3,
                    pi_u_true=torch.tensor([1 / 7, 2 / 7, 4 / 7]), **data)
    return out, m, crit


def _assert_same_run(a, b, *, exact=True):
    (oa, ma, ca), (ob, mb, cb) = a, b
    tol = {"rtol": 0, "atol": 0} if exact else {}
    for pa, pb in zip(list(ma.parameters()) + list(oa["ema_model"].parameters()),
                      list(mb.parameters()) + list(ob["ema_model"].parameters()), strict=True):
        torch.testing.assert_close(pa, pb, **tol)
    assert oa["kl_history"] == ob["kl_history"] and oa["mask_rate"] == ob["mask_rate"]
    torch.testing.assert_close(ca.pi_u, cb.pi_u, **tol)
    assert ca.updates == cb.updates


def test_dataloader_path_equals_tensor_path_on_the_same_batches():
    xl, yl, xu = _data()
    rec = _Recorder()
    steps = 40  # labeled: 21 // 4 = 5 batches per pass (8 passes); unlabeled: 70 // 8 = 8 per pass (5 passes)
    ref = _run(x_l=xl, y_l=yl, x_u=xu, augment=rec, batch_size=4, mu=2, steps=steps)
    assert len(rec.seen) == 5 * steps  # per step: labeled weak + strong, unlabeled weak + 2 strong
    lab = [_rows(rec.seen[5 * s], xl) for s in range(steps)]
    unl = [_rows(rec.seen[5 * s + 2], xu) for s in range(steps)]
    assert len({tuple(b) for b in lab}) > 5  # reshuffled every pass
    dl_l = DataLoader(TensorDataset(xl, yl), batch_sampler=_EpochBatches(lab, 5))
    hidden = torch.arange(len(xu)) % K  # an unlabeled set that still carries labels: (x, y) batches, y ignored
    dl_u = DataLoader(TensorDataset(xu, hidden), batch_sampler=_EpochBatches(unl, 8))
    _assert_same_run(ref, _run(labeled=dl_l, unlabeled=dl_u, augment=_aug, steps=steps))
    # any re-iterable of batches: a list of one full (x, y) batch is the tensor path's full batch (rows permuted:
    # equal to float rounding)
    ref_sup = _run("supervised", x_l=xl, y_l=yl, x_u=None, augment=_aug, batch_size=21, steps=6)
    _assert_same_run(ref_sup, _run("supervised", labeled=[(xl, yl)], x_u=None, augment=_aug, steps=6), exact=False)


def test_shuffled_dataloader_and_one_shot_iterable_run_deterministically():
    xl, yl, xu = _data()

    def loaders(seed):
        gl, gu = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
        return dict(labeled=DataLoader(TensorDataset(xl, yl), batch_size=4, shuffle=True, drop_last=True,
                                       generator=gl),
                    unlabeled=DataLoader(TensorDataset(xu), batch_size=8, shuffle=True, drop_last=True,
                                         generator=gu), augment=gaussian_augment)

    a, b, c = _run(**loaders(0)), _run(**loaders(0)), _run(**loaders(5))
    _assert_same_run(a, b)
    assert len(a[0]["kl_history"]) == 4
    assert not torch.equal(a[1][0].weight, c[1][0].weight)  # the loader's order matters
    # a generator has no len(): scale_ratio given by hand; labeled tensors mixed with an unlabeled iterable
    batches = (xu[8 * (s % 8):8 * (s % 8) + 8] for s in range(12))
    out, _, crit = _run(x_l=xl, y_l=yl, unlabeled=batches, augment=gaussian_augment, steps=12, scale_ratio=1.6)
    assert crit.updates == 1 and 0.0 <= out["mask_rate"] <= 1.0


# ------------------------------------------------------------------------------------------ bad input
def _gen(n):
    xl, yl, _ = _data()
    return ((xl[:4], yl[:4]) for _ in range(n))


_XL, _YL, _XU = _data()
_DL = DataLoader(TensorDataset(_XL, _YL), batch_size=4, drop_last=True)
_DU = DataLoader(TensorDataset(_XU), batch_size=8, drop_last=True)


@pytest.mark.parametrize("kw, exc, match", [
    ({"labeled": _DL, "x_l": _XL, "y_l": _YL, "x_u": _XU}, ValueError, "either as x_l, y_l or as labeled="),
    ({"x_u": _XU}, ValueError, "labeled data is missing"),
    ({"x_l": _XL, "x_u": _XU}, ValueError, "labeled data is missing"),
    ({"labeled": _DL, "unlabeled": _DU, "x_u": _XU}, ValueError, "either as x_u or as unlabeled="),
    ({"labeled": _DL}, TypeError, r"pass x_u \(unlabeled tensors; None for supervised"),
    ({"labeled": _XL, "x_u": _XU}, TypeError, "got a tensor"),
    ({"labeled": TensorDataset(_XL, _YL), "x_u": _XU}, TypeError, "map-style Dataset"),
    ({"labeled": 5, "x_u": _XU}, TypeError, "iterable of batches, got an object of type int"),
    ({"labeled": [{"x": _XL, "y": _YL}], "x_u": _XU}, TypeError, r"labeled batch 0 must be an \(x, y\) pair"),
    ({"labeled": [(_XL, _YL, _YL)], "x_u": _XU}, TypeError, "pair, got a tuple of 3 elements"),
    ({"labeled": [(_XL, _YL.float())], "x_u": _XU}, TypeError, "labeled batch 0: y must have dtype"),
    ({"labeled": [(_XL, _YL + 1)], "x_u": _XU}, ValueError, r"labeled batch 0: labels must lie in \[0, 3\)"),
    ({"labeled": [(_XL[:5], _YL[:4])], "x_u": _XU}, ValueError, "labeled batch 0 has 5 inputs but 4 labels"),
    ({"labeled": [(_XL[:0], _YL[:0])], "x_u": _XU}, ValueError, "labeled batch 0 is empty"),
    ({"labeled": [], "x_u": _XU}, ValueError, r"labeled has no batches \(len 0\)"),
    ({"labeled": DataLoader(TensorDataset(_XL, _YL), batch_size=64, drop_last=True), "x_u": _XU}, ValueError,
     r"labeled has no batches \(len 0\)"),
    ({"labeled": _DL, "unlabeled": [{"x": _XU}]}, TypeError, "unlabeled batch 0: x must be a torch.Tensor"),
    ({"labeled": _gen(3), "x_u": _XU}, ValueError, "labeled has no len"),
    ({"labeled": _DL, "unlabeled": _DU, "batch_size": 4}, ValueError, "batch_size sizes tensor inputs only"),
    ({"labeled": _DL, "x_u": None, "batch_size": 4}, ValueError, "batch_size sizes tensor inputs only"),
    ({"x_l": _XL, "y_l": _YL, "unlabeled": _DU, "mu": 2}, ValueError, "mu sizes unlabeled tensor batches"),
    ({"labeled": _DL, "unlabeled": _DU, "scale_ratio": 0.0}, ValueError, "scale_ratio"),
    ({"x_l": _XL.numpy(), "y_l": _YL, "x_u": _XU}, TypeError, "x_l must be a torch.Tensor"),
])
def test_bad_data_sources_raise_before_compute(kw, exc, match):
    model = torch.nn.Linear(4, K)
    before = [p.detach().clone() for p in model.parameters()]
    crit = make_criterion("simpro", num_classes=K, labeled_counts=COUNTS_L)
    with pytest.raises(exc, match=match):
        train_ssl(model=model, criterion=crit, augment=_aug, steps=3, **kw)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_exhausted_one_shot_iterable_says_so():
    crit = make_criterion("simpro", num_classes=K, labeled_counts=COUNTS_L)
    with pytest.raises(ValueError, match="yielded no batches after 3 batches: a one-shot iterator"):
        train_ssl(model=torch.nn.Linear(4, K), criterion=crit, labeled=_gen(3), x_u=_XU, augment=_aug, steps=5,
                  scale_ratio=1.0)
