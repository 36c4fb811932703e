"""Cross-checks against LibAUC 2.0.1 (installed ``--no-deps``; skipped where absent): loss values, and with K = 1,
I = 1 our AUC-M minimax and two-level compositional updates track PESG / PDSCA step for step where they coincide.

Where they differ, and how the tests align them:
- LibAUC's ``AUCMLoss``/``CompositionalAUCLoss`` v1 re-estimate p from each batch unless ``auto=False``; ours takes
  p as a fixed argument (tests pass ``auto=False``).
- LibAUC v2's cross term is ``mean(h·1[y=0] − mean_+(h))`` over all N samples (issue #74); ours is E_−[h] − E_+[h].
- PESG/PDSCA update α by the closed form 2(m + b − a) − 2α with the already-updated a, b and no dual momentum: ours
  does so with ``dual_grad="pesg", gamma_y=1`` (the default is the exact ∂f/∂α with momentum).
- PDSCA writes the moving average into the weights (w ← h − η m) and clips the inner CE gradient too: ours with
  ``primal_from="estimator"``, ``jacobian="identity"`` and no clipping (PDSCA's clip set out of reach).
- PDSCA chooses its CE or AUC phase by ``alpha.grad is None``, but its ``zero_grad`` never clears α's gradient (α is
  not in its parameter groups), so after the first AUC step every step would be an AUC step; the test clears it.
- PDSCA's two phases draw two batches per iteration; the test feeds the same batch to both (ours uses one).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from icml24.fed_auc import FederatedCompositionalAUC, aucm_loss, bce_on_logits

libauc = pytest.importorskip("libauc", reason="LibAUC 2.0.1 not installed (pip install --no-deps 'libauc==2.0.1')")
from libauc.losses import AUCMLoss, CompositionalAUCLoss  # noqa: E402
from libauc.optimizers import PDSCA, PESG  # noqa: E402

P = 0.25


def _data(n: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (torch.rand(n, generator=g) < P).long()
    y[:2] = torch.tensor([1, 0])
    return x + 0.8 * y[:, None], y


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))


def _set(loss_fn, a, b, al):
    with torch.no_grad():
        loss_fn.a.fill_(a), loss_fn.b.fill_(b), loss_fn.alpha.fill_(al)


def _assert_tracks(st, model, loss_fn) -> None:
    """Our primal, (a, b) and dual state equal LibAUC's model and loss parameters."""
    lib_w = torch.cat([p.detach().reshape(-1) for p in model[0].parameters()])
    torch.testing.assert_close(st["w"], lib_w, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(st["ab"], torch.cat([loss_fn.a.detach(), loss_fn.b.detach()]), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(st["alpha"], loss_fn.alpha.detach(), rtol=1e-4, atol=1e-6)


def test_loss_values_equal_libauc():
    x, y = _data()
    h = torch.sigmoid(_net()(x)).detach()
    a, b, al = 0.6, 0.2, 0.4
    t = lambda v: torch.tensor(v)  # noqa: E731
    lib = AUCMLoss(margin=0.9, imratio=P, version="v1", device="cpu")
    _set(lib, a, b, al)
    ours = aucm_loss(h, y, a=t(a), b=t(b), alpha=t(al), margin=0.9, imratio=P, version="v1")
    torch.testing.assert_close(lib(h, y.float(), auto=False).reshape(()), ours, rtol=1e-6, atol=1e-7)
    # v2: LibAUC's cross term divides by N (issue #74): libauc = ours − 2α(N_+/N)E_−[h]
    lib2 = AUCMLoss(margin=0.9, version="v2", device="cpu")
    _set(lib2, a, b, al)
    ours2 = aucm_loss(h, y, a=t(a), b=t(b), alpha=t(al), margin=0.9, version="v2")
    n_pos = float(y.sum())
    shift = 2 * al * (n_pos / len(y)) * h.reshape(-1)[y == 0].mean()
    torch.testing.assert_close(lib2(h, y.float()).reshape(()), ours2 - shift, rtol=1e-6, atol=1e-6)
    assert abs(float(shift)) > 1e-3
    # CompositionalAUCLoss(k=1): a CE call on probabilities, then an AUC-M v1 call
    comp = CompositionalAUCLoss(margin=0.9, k=1, imratio=P, version="v1", device="cpu")
    _set(comp, a, b, al)
    logits = _net()(x).detach()
    torch.testing.assert_close(comp(torch.sigmoid(logits), y.float(), auto=False).reshape(()),
                               bce_on_logits(logits, y), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(comp(h, y.float(), auto=False).reshape(()), ours, rtol=1e-6, atol=1e-7)


def _batches(T: int, n: int = 64, bs: int = 16):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(n, (bs,), generator=g) for _ in range(T)]


def test_federated_aucm_with_one_client_tracks_pesg():
    x, y = _data()
    net = _net()
    model = nn.Sequential(copy.deepcopy(net), nn.Sigmoid())
    lr, mom = 0.1, 0.8
    loss_fn = AUCMLoss(margin=1.0, imratio=P, version="v1", device="cpu")
    opt = PESG(model.parameters(), loss_fn=loss_fn, lr=lr, momentum=mom, clip_value=1.0, weight_decay=0.0,
               epoch_decay=0.0, device="cpu", verbose=False)
    algo = FederatedCompositionalAUC(net, objective="aucm", lr_x=lr, lr_y=lr, gamma=mom, gamma_y=1.0, imratio=P,
                                     loss_version="v1", clip_value=1.0, dual_grad="pesg", local_steps=1)
    st = algo.init_state()
    for idx in _batches(12):
        loss = loss_fn(model(x[idx]), y[idx].float(), auto=False)
        opt.zero_grad()
        loss.backward()
        opt.step()
        algo.local_step(st, x[idx], y[idx])
    _assert_tracks(st, model, loss_fn)
    assert float(st["alpha"][0]) > 0.05  # the dual moved


def test_two_level_compositional_with_one_client_tracks_pdsca():
    x, y = _data()
    net = _net()
    model = nn.Sequential(copy.deepcopy(net), nn.Sigmoid())
    lr, lr0, b1, b2 = 0.1, 0.2, 0.7, 0.8
    loss_fn = CompositionalAUCLoss(margin=1.0, k=1, imratio=P, version="v1", device="cpu")
    opt = PDSCA(model.parameters(), loss_fn=loss_fn, lr=lr, lr0=lr0, beta1=b1, beta2=b2, clip_value=1e9,
                weight_decay=0.0, epoch_decay=0.0, device="cpu", verbose=False)
    algo = FederatedCompositionalAUC(net, objective="compositional", levels=2, eta0=lr0, lr_x=lr, lr_y=lr, beta=b1,
                                     gamma=b2, gamma_y=1.0, imratio=P, loss_version="v1", jacobian="identity",
                                     primal_from="estimator", dual_grad="pesg", local_steps=1)
    st = algo.init_state()
    for idx in _batches(10):
        for _phase in ("ce", "auc"):
            if _phase == "ce":
                loss_fn.alpha.grad = None
            loss = loss_fn(model(x[idx]), y[idx].float(), auto=False)
            opt.zero_grad()
            loss.backward()
            opt.step()
        algo.local_step(st, x[idx], y[idx])
    _assert_tracks(st, model, loss_fn)
    # PDSCA's weight buffer is our estimator h_1
    buf = torch.cat([opt.state[p]["weight_buffer"].reshape(-1) for p in model[0].parameters()])
    torch.testing.assert_close(st["h1"], buf, rtol=1e-4, atol=1e-6)


def test_libauc_stabilisers_track_pesg_with_epoch_decay_and_update_regularizer():
    """Issue 29: clip 1.0, the epoch-decay proximal term and ``update_regularizer(decay_factor)`` (η/10 and x_ref ←
    the stage's average iterate) as in PESG, step for step (K = 1, I = 1: every iterate is a synchronised one).
    PESG draws its first x_ref at random (std 0.01); ours starts at the initial point (PESG's docstring), so the
    test sets PESG's to the initial point."""
    x, y = _data()
    net = _net()
    model = nn.Sequential(copy.deepcopy(net), nn.Sigmoid())
    lr, mom, ed, T, d1, d2 = 0.3, 0.8, 0.05, 14, 5, 10
    loss_fn = AUCMLoss(margin=1.0, imratio=P, version="v1", device="cpu")
    opt = PESG(model.parameters(), loss_fn=loss_fn, lr=lr, momentum=mom, clip_value=1.0, weight_decay=0.0,
               epoch_decay=ed, device="cpu", verbose=False)
    init = [p.detach().clone() for p in model[0].parameters()] + [loss_fn.a.detach().clone(),
                                                                   loss_fn.b.detach().clone()]
    assert len(opt.model_ref) == len(init)
    for r, p0 in zip(opt.model_ref, init, strict=True):
        r.data = p0.clone()
    algo = FederatedCompositionalAUC(net, objective="aucm", lr_x=lr, lr_y=lr, gamma=mom, gamma_y=1.0, imratio=P,
                                     loss_version="v1", clip_value=1.0, dual_grad="pesg", local_steps=1,
                                     epoch_decay=ed, decay_at=(d1, d2), decay_factor=10.0)
    st = algo.init_state()
    for t, idx in enumerate(_batches(T)):
        if t in (d1, d2):
            opt.update_regularizer(decay_factor=10)
        loss = loss_fn(model(x[idx]), y[idx].float(), auto=False)
        opt.zero_grad()
        loss.backward()
        opt.step()
        algo.local_step(st, x[idx], y[idx])
        _assert_tracks(st, model, loss_fn)
    ref = torch.cat([r.reshape(-1) for r in opt.model_ref[:-2]])
    torch.testing.assert_close(st["w_ref"], ref, rtol=1e-4, atol=1e-6)
    assert (st["w_ref"] - torch.cat([p.reshape(-1) for p in init[:-2]])).abs().max() > 1e-3  # it was reset
    assert opt.param_groups[0]["lr"] == pytest.approx(lr / 100) and algo.lr_scale(T) == pytest.approx(1 / 100)
