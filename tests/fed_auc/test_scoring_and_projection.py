"""fed_auc: scoring runs the model in eval mode (BatchNorm's running statistics used, never updated), and the
dual variable is projected onto α ≥ 0 (a test that fails when the projection is removed)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from icml24.fed_auc import FederatedCompositionalAUC, simulate

DT = torch.float64


def _bn_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Dropout(0.3), nn.Linear(6, 1)).to(DT)


def _clients(K: int, n: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(K):
        y = (torch.rand(n, generator=g) < 0.3).long()
        y[0] = 1
        out.append((torch.randn(n, 5, generator=g, dtype=DT) * 2.0 + 1.0 + y[:, None].to(DT), y))
    return out


@pytest.mark.parametrize("objective, weights", [("compositional", "predictor"), ("compositional", "x"),
                                                ("aucm", "predictor"), ("ce", "predictor")])
def test_scores_of_a_batchnorm_model_are_eval_mode_and_leave_running_stats_alone(objective, weights):
    model = _bn_net()
    algo = FederatedCompositionalAUC(model, objective=objective, levels=3, local_steps=2, loss_version="v2",
                                     jacobian="identity")
    state = simulate(algo, _clients(2), rounds=3, batch_size=8, seed=1).state
    bn = model[1]
    assert float(bn.running_mean.abs().max()) > 0.1  # training moved the running statistics
    before = {k: b.clone() for k, b in model.named_buffers()}
    x = _clients(1, n=10, seed=5)[0][0]
    got = algo.scores(state, x, weights=weights)
    for k, b in model.named_buffers():  # running_mean, running_var and num_batches_tracked unchanged
        assert torch.equal(b, before[k]), k
    assert model.training and all(m.training for m in model.modules())  # the caller's mode is restored
    ref_model = copy.deepcopy(model)
    w = algo.predictor_weights(state) if weights == "predictor" else state["w"]
    torch.nn.utils.vector_to_parameters(w, ref_model.parameters())
    ref_model.eval()
    with torch.no_grad():
        ref = torch.sigmoid(ref_model(x).reshape(-1))
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)
    # eval mode: a sample's score does not depend on the rest of the batch (train-mode BN would mix them)
    torch.testing.assert_close(algo.scores(state, x[:3], weights=weights), got[:3], rtol=1e-12, atol=1e-14)


def test_scores_restore_a_mixed_mode_and_reject_unknown_weights():
    model = _bn_net()
    algo = FederatedCompositionalAUC(model, objective="aucm", loss_version="v2")
    model[1].eval()  # a mixed state is restored module by module
    algo.scores(algo.init_state(), torch.randn(4, 5, dtype=DT))
    assert model.training and not model[1].training and model[3].training
    with pytest.raises(ValueError, match="weights must be one of"):
        algo.scores(algo.init_state(), torch.randn(4, 5, dtype=DT), weights="h1")


def _separating_net(scale: float) -> nn.Module:
    lin = nn.Linear(1, 1).to(DT)
    with torch.no_grad():
        lin.weight.fill_(scale)
        lin.bias.zero_()
    return lin


def _separable(n: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = (torch.arange(n) % 4 == 0).long()
    x = (2.0 * y.to(DT) - 1.0)[:, None] * (1.0 + torch.rand(n, 1, generator=g, dtype=DT))
    return x, y


@pytest.mark.parametrize("objective, levels", [("aucm", 2), ("compositional", 2), ("compositional", 3)])
@pytest.mark.parametrize("dual_grad, version", [("exact", "v2"), ("exact", "v1"), ("pesg", "v2")])
def test_alpha_is_projected_onto_the_non_negative_half_line(objective, levels, dual_grad, version):
    x, y = _separable()
    kw = dict(objective=objective, levels=levels, local_steps=2, loss_version=version, imratio=0.25, margin=0.1,
              lr_x=0.01, lr_y=0.5, eta0=0.01, dual_grad=dual_grad, gamma=1.0, jacobian="identity")
    # scores already separate the classes by more than the margin: ∂f/∂α < 0 at α = 0, the ascent step would
    # take α below 0 and the projection sets it to 0 (α* = max(0, m + b − a) = 0)
    algo = FederatedCompositionalAUC(_separating_net(20.0), **kw)
    st = algo.init_state()
    st["ab"] = torch.tensor([1.0, 0.0], dtype=DT)  # a, b at the class means (PESG's closed form reads them)
    st = algo.local_step(st, x, y)
    assert float(st["n"]) < -0.05  # the unprojected α + η_y n would be negative ...
    assert float(st["alpha"]) == 0.0  # ... and is projected to 0
    st = algo.local_step(st, x, y)
    assert float(st["alpha"]) == 0.0
    # minibatches (some without a positive, where ∂f/∂α = 2m > 0): α stays >= 0 after every round
    res = simulate(algo, [(x, y), (x.flip(0), y.flip(0))], rounds=6, batch_size=10, seed=0,
                   callback=lambda r, s, f: float(s["alpha"]))
    assert len(res.callbacks) == 6 and min(res.callbacks) >= 0.0
    # the projection is not a reset: with overlapping scores (a − b < m) α rises above 0
    algo = FederatedCompositionalAUC(_separating_net(0.1), **kw)
    st = algo.local_step(algo.init_state(), x, y)
    assert float(st["alpha"]) > 0.0 and float(st["alpha"]) == pytest.approx(0.5 * float(st["n"]), rel=1e-12)
