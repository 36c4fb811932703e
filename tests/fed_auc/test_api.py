"""fed_auc: AUC-M closed forms, JVP vs finite differences, exact reductions against a naive reference, averaging
invariants, the estimator's convergence, dropped/failed clients, bad input."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from icml24.fed_auc import (
    FederatedCompositionalAUC,
    aucm_loss,
    aucm_optimal_ab,
    aucm_optimal_alpha,
    average_states,
    compositional_auc_objective,
    dirichlet_split,
    load_task,
    simulate,
)
from icml24.fed_auc.backends import client_generator

DT = torch.float64


def _net(d: int = 5, h: int = 4, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, h), nn.Tanh(), nn.Linear(h, 1)).to(DT)


def _clients(K: int, n: int = 24, d: int = 5, seed: int = 0, pos: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(K):
        x = torch.randn(n, d, generator=g, dtype=DT)
        y = (torch.rand(n, generator=g) < pos).long()
        y[0] = 1
        out.append((x + y[:, None].to(DT), y))
    return out


# ------------------------------------------------------------------------------------------- AUC-M loss
def _naive_v1(h, y, a, b, al, m, p):
    tot = 0.0
    for hi, yi in zip(h.tolist(), y.tolist(), strict=True):
        pos, neg = float(yi == 1), float(yi == 0)
        tot += ((1 - p) * (hi - a) ** 2 * pos + p * (hi - b) ** 2 * neg
                + 2 * al * (p * (1 - p) * m + p * hi * neg - (1 - p) * hi * pos) - p * (1 - p) * al ** 2)
    return tot / len(h)


def _naive_v2(h, y, a, b, al, m):
    hp = [x for x, t in zip(h.tolist(), y.tolist(), strict=True) if t == 1]
    hn = [x for x, t in zip(h.tolist(), y.tolist(), strict=True) if t == 0]
    mp, mn = sum(hp) / len(hp), sum(hn) / len(hn)
    return (sum((x - a) ** 2 for x in hp) / len(hp) + sum((x - b) ** 2 for x in hn) / len(hn)
            + 2 * al * (m + mn - mp) - al ** 2)


def test_aucm_loss_matches_the_per_sample_formulas():
    g = torch.Generator().manual_seed(0)
    h = torch.rand(50, generator=g, dtype=DT)
    y = (torch.rand(50, generator=g) < 0.2).long()
    a, b, al = torch.tensor(0.7, dtype=DT), torch.tensor(0.2, dtype=DT), torch.tensor(0.4, dtype=DT)
    v1 = aucm_loss(h, y, a=a, b=b, alpha=al, margin=0.8, imratio=0.15, version="v1")
    v2 = aucm_loss(h, y, a=a, b=b, alpha=al, margin=0.8, version="v2")
    assert float(v1) == pytest.approx(_naive_v1(h, y, 0.7, 0.2, 0.4, 0.8, 0.15), rel=1e-12)
    assert float(v2) == pytest.approx(_naive_v2(h, y, 0.7, 0.2, 0.4, 0.8), rel=1e-12)
    # LibAUC 2.0.1's v2 cross term mean(h·neg − mean(h·pos)) divides by N, not N_- (issue #74): ours differs
    buggy = (((h - a) ** 2 * y).sum() / y.sum() + ((h - b) ** 2 * (1 - y)).sum() / (1 - y).sum()
             + 2 * al * (0.8 + (h * (1 - y) - (h * y).mean()).sum() / (h * (1 - y) - (h * y).mean()).count_nonzero())
             - al ** 2)
    assert abs(float(buggy) - float(v2)) > 1e-3


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_aucm_closed_forms_class_means_and_alpha_star(version):
    g = torch.Generator().manual_seed(1)
    h = torch.rand(40, generator=g, dtype=DT)
    y = (torch.rand(40, generator=g) < 0.3).long()
    p = float(y.double().mean())  # v1's closed forms hold with p = the sample's positive ratio
    a_star, b_star = aucm_optimal_ab(h, y)
    assert float(a_star) == pytest.approx(float(h[y == 1].mean())) and float(b_star) == pytest.approx(float(h[y == 0].mean()))
    for m in (1.0, 0.05):
        al_star = aucm_optimal_alpha(a=a_star, b=b_star, margin=m)
        assert float(al_star) == pytest.approx(max(0.0, m + float(b_star - a_star)))
        a, b, al = (t.clone().requires_grad_(True) for t in (a_star, b_star, al_star.to(DT)))
        f = aucm_loss(h, y, a=a, b=b, alpha=al, margin=m, imratio=p, version=version)
        ga, gb, gal = torch.autograd.grad(f, (a, b, al))
        assert abs(float(ga)) < 1e-12 and abs(float(gb)) < 1e-12
        if float(al_star) > 0:
            assert abs(float(gal)) < 1e-12  # interior maximiser
        else:
            assert float(gal) < 0  # at the boundary α = 0 the ascent direction points outside α ≥ 0
    assert float(aucm_optimal_alpha(a=0.9, b=0.1, margin=0.5)) == 0.0


def test_aucm_v2_batch_without_positives_is_finite():
    h = torch.rand(8, dtype=DT, requires_grad=True)
    f = aucm_loss(h, torch.zeros(8, dtype=torch.long), a=torch.tensor(0.5, dtype=DT), b=torch.tensor(0.1, dtype=DT),
                  alpha=torch.tensor(0.3, dtype=DT), version="v2")
    (gh,) = torch.autograd.grad(f, h)
    assert torch.isfinite(f) and torch.isfinite(gh).all()


# ------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("levels", [2, 3])
def test_estimator_gradient_is_the_exact_chain_rule_and_matches_finite_differences(levels):
    """β = 1 at the first step makes h_l = u_l(x) exactly, so G_x must be ∇_x f(u_{L−1}(x))."""
    net = _net()
    (x, y), = _clients(1)
    algo = FederatedCompositionalAUC(net, levels=levels, eta0=0.3, lr_x=1.0, lr_y=0.1, beta=1.0, gamma=1.0,
                                     loss_version="v2", jacobian="hvp")
    st = algo.init_state()
    w0, ab, al = st["w"].clone(), torch.tensor([0.6, 0.3], dtype=DT), torch.tensor([0.5], dtype=DT)
    st["ab"], st["alpha"] = ab.clone(), al.clone()
    algo.local_step(st, x, y)
    g_alg = (w0 - st["w"]) / 1.0  # lr_x = 1, γ = 1: the step is −G_x

    ce = lambda w: algo._ce(w, x, y)  # noqa: E731
    auc = lambda u: algo._auc(u, ab, al, x, y)  # noqa: E731
    F = lambda w: compositional_auc_objective(w, ce=ce, auc=auc, levels=levels, eta0=0.3)  # noqa: E731
    wr = w0.clone().requires_grad_(True)
    (g_auto,) = torch.autograd.grad(F(wr), wr)
    torch.testing.assert_close(g_alg, g_auto, rtol=1e-10, atol=1e-12)
    eps = 1e-6
    fd = torch.stack([(F(w0 + eps * e).detach() - F(w0 - eps * e).detach()) / (2 * eps)
                      for e in torch.eye(len(w0), dtype=DT)])
    torch.testing.assert_close(g_alg, fd, rtol=1e-4, atol=1e-7)
    # the identity approximation drops the −η0∇²L_CE terms: it differs
    algo_id = FederatedCompositionalAUC(_net(), levels=levels, eta0=0.3, lr_x=1.0, lr_y=0.1, beta=1.0, gamma=1.0,
                                        loss_version="v2", jacobian="identity")
    st2 = algo_id.init_state()
    st2["ab"], st2["alpha"] = ab.clone(), al.clone()
    algo_id.local_step(st2, x, y)
    assert (w0 - st2["w"] - g_auto).abs().max() > 1e-4


def test_compositional_differs_from_minimax_and_reduces_to_it_at_eta0_zero():
    clients = _clients(2)
    kw = dict(lr_x=0.2, lr_y=0.2, beta=1.0, gamma=0.5, local_steps=2, loss_version="v2")
    runs = {}
    for name, obj, eta0 in (("aucm", "aucm", 0.3), ("comp", "compositional", 0.3), ("comp0", "compositional", 0.0)):
        algo = FederatedCompositionalAUC(_net(), objective=obj, levels=2, eta0=eta0, **kw)
        runs[name] = simulate(algo, clients, rounds=3, batch_size=8, seed=1).state
    assert (runs["comp"]["w"] - runs["aucm"]["w"]).abs().max() > 1e-3
    for k in ("w", "ab", "alpha", "m_w", "n"):
        torch.testing.assert_close(runs["comp0"][k], runs["aucm"][k], rtol=0, atol=1e-14)


# ------------------------------------------------------------------------------------------- naive reference
def _naive_run(net, clients, *, objective, L, I, rounds, eta0, lr_x, lr_y, beta, gamma, seed, batch,
               jacobian="hvp", jvp_beta=None, clip=None, epoch_decay=0.0, decay_at=(), decay_factor=10.0):
    """LocalSCGDAM / multi-level / AUC-M / CE written out with explicit Hessians (J_l = I − η0 H) and
    explicit averaging; independent of the library's update code (shares only the batch sampler contract).

    ``jacobian="estimator"``: z_l ← (1−β_J)z_l + β_J J_lᵀ z_{l+1} (z_L = ∇_u f), G = z_1, the z_l averaged too.
    LibAUC's stabilisers: g ← clip(g) + λ0(p − p_ref) on w, a, b; p_ref = the initial p, then at each step count in
    ``decay_at`` the mean of the synchronised iterates at the round starts since the last reset; η_x, η_y divided by
    ``decay_factor`` from each step count in ``decay_at`` on."""
    jb = beta if jvp_beta is None else jvp_beta
    names = [k for k, _ in net.named_parameters()]
    shapes = [p.shape for _, p in net.named_parameters()]
    sizes = [p.numel() for _, p in net.named_parameters()]
    w0 = torch.cat([p.detach().reshape(-1) for p in net.parameters()])

    def fwd(w, x):
        W1, b1, W2, b2 = (t.view(s) for t, s in zip(torch.split(w, sizes), shapes, strict=True))
        return (torch.tanh(x @ W1.T + b1) @ W2.T + b2).reshape(-1)

    assert names == ["0.weight", "0.bias", "2.weight", "2.bias"]

    def ce(w, x, y):
        z = fwd(w, x)
        return torch.mean(torch.clamp(z, min=0) - z * y + torch.log1p(torch.exp(-z.abs())))

    def auc(w, a, b, al, x, y, m=1.0):
        h = torch.sigmoid(fwd(w, x))
        yf = y.to(DT)
        mp = (h * yf).sum() / yf.sum().clamp_min(1)
        mn = (h * (1 - yf)).sum() / (1 - yf).sum().clamp_min(1)
        return (((h - a) ** 2 * yf).sum() / yf.sum().clamp_min(1) + ((h - b) ** 2 * (1 - yf)).sum()
                / (1 - yf).sum().clamp_min(1) + 2 * al * (m + mn - mp) - al ** 2)

    K = len(clients)
    S = [dict(w=w0.clone(), a=torch.zeros((), dtype=DT), b=torch.zeros((), dtype=DT), al=torch.zeros((), dtype=DT),
              mw=None, ma=None, mb=None, n=None, h=[None] * (L - 1), z=[None] * (L - 1), t=0) for _ in range(K)]
    cl = (lambda g: g) if clip is None else (lambda g: torch.clamp(g, -clip, clip))  # noqa: E731
    gens = [client_generator(seed, k) for k in range(K)]
    for _ in range(rounds):
        for k, (x, y) in enumerate(clients):
            s = S[k]
            for _ in range(I):
                t = s["t"]
                if epoch_decay > 0:
                    if t == 0:
                        s["ref"], s["acc"], s["cnt"] = (s["w"], s["a"], s["b"]), [0.0, 0.0, 0.0], 0
                    elif t % I == 0:
                        s["acc"] = [s["acc"][0] + s["w"], s["acc"][1] + s["a"], s["acc"][2] + s["b"]]
                        s["cnt"] += 1
                        if t in decay_at:
                            s["ref"] = tuple(v / s["cnt"] for v in s["acc"])
                            s["acc"], s["cnt"] = [0.0, 0.0, 0.0], 0
                sc = decay_factor ** -sum(d <= t for d in decay_at)
                idx = torch.randint(len(y), (batch,), generator=gens[k])
                xb, yb = x[idx], y[idx]
                yf = yb.to(DT)
                if objective == "ce":
                    gw = torch.func.grad(lambda w: ce(w, xb, yf))(s["w"])  # noqa: B023 (called at once)
                    ga = gb = gal = None
                elif objective == "aucm":
                    gw, ga, gb, gal = torch.func.grad(lambda w, a, b, al: auc(w, a, b, al, xb, yb),  # noqa: B023 (called at once)
                                                      argnums=(0, 1, 2, 3))(s["w"], s["a"], s["b"], s["al"])
                else:
                    pt, Js = s["w"], []
                    for lvl in range(L - 1):
                        new = pt - eta0 * torch.func.grad(lambda w: ce(w, xb, yf))(pt)  # noqa: B023 (called at once)
                        H = torch.autograd.functional.hessian(lambda w: ce(w, xb, yf), pt)  # noqa: B023 (called at once)
                        Js.append(torch.eye(len(pt), dtype=DT) - eta0 * H)
                        s["h"][lvl] = new if s["h"][lvl] is None else (1 - beta) * s["h"][lvl] + beta * new
                        pt = s["h"][lvl]
                    gu, ga, gb, gal = torch.func.grad(lambda w, a, b, al: auc(w, a, b, al, xb, yb),  # noqa: B023 (called at once)
                                                      argnums=(0, 1, 2, 3))(pt, s["a"], s["b"], s["al"])
                    gw = gu
                    for lvl in reversed(range(L - 1)):
                        J = Js[lvl] if jacobian != "identity" else torch.eye(len(gw), dtype=DT)
                        gw = J.T @ gw
                        if jacobian == "estimator":
                            s["z"][lvl] = gw if s["z"][lvl] is None else (1 - jb) * s["z"][lvl] + jb * gw
                            gw = s["z"][lvl]
                gw = cl(gw)
                if objective != "ce":
                    ga, gb = cl(ga), cl(gb)
                if epoch_decay > 0:
                    gw = gw + epoch_decay * (s["w"] - s["ref"][0])
                    if objective != "ce":
                        ga, gb = ga + epoch_decay * (s["a"] - s["ref"][1]), gb + epoch_decay * (s["b"] - s["ref"][2])
                ema = lambda old, g: g if old is None else (1 - gamma) * old + gamma * g  # noqa: E731
                s["mw"] = ema(s["mw"], gw)
                s["w"] = s["w"] - sc * lr_x * s["mw"]
                if objective != "ce":
                    s["ma"], s["mb"], s["n"] = ema(s["ma"], ga), ema(s["mb"], gb), ema(s["n"], gal)
                    s["a"], s["b"] = s["a"] - sc * lr_x * s["ma"], s["b"] - sc * lr_x * s["mb"]
                    s["al"] = torch.clamp(s["al"] + sc * lr_y * s["n"], min=0.0)
                s["t"] = t + 1
        for key in ("w", "a", "b", "al", "mw", "ma", "mb", "n"):
            if S[0][key] is not None:
                avg = sum(s[key] for s in S) / K
                for s in S:
                    s[key] = avg.clone()
        for est in ("h", "z"):
            for lvl in range(L - 1):
                if S[0][est][lvl] is not None:
                    avg = sum(s[est][lvl] for s in S) / K
                    for s in S:
                        s[est][lvl] = avg.clone()
    return S[0]


@pytest.mark.parametrize("objective, L, K, I", [
    ("compositional", 3, 1, 1),   # K=1, I=1: the single-machine multi-level update
    ("compositional", 2, 2, 2),   # L=2: the two-level LocalSCGDAM
    ("compositional", 3, 3, 2),   # the federated multi-level method
    ("aucm", 2, 2, 3),            # federated AUC-M minimax
    ("ce", 2, 2, 3),              # CE-FedAvg with momentum
])
def test_federated_algorithm_equals_the_naive_reference(objective, L, K, I):
    clients = _clients(K)
    hp = dict(eta0=0.3, lr_x=0.2, lr_y=0.1, beta=0.6, gamma=0.7)
    algo = FederatedCompositionalAUC(_net(), objective=objective, levels=L, local_steps=I, loss_version="v2", **hp)
    got = simulate(algo, clients, rounds=3, batch_size=8, seed=4).state
    ref = _naive_run(_net(), clients, objective=objective, L=L, I=I, rounds=3, seed=4, batch=8, **hp)
    torch.testing.assert_close(got["w"], ref["w"], rtol=1e-9, atol=1e-11)
    if objective != "ce":
        torch.testing.assert_close(got["ab"], torch.stack([ref["a"], ref["b"]]), rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(got["alpha"], ref["al"].reshape(1), rtol=1e-9, atol=1e-11)
    for lvl in range(L - 1 if objective == "compositional" else 0):
        torch.testing.assert_close(got[f"h{lvl + 1}"], ref["h"][lvl], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("objective, L, K, I, jacobian", [
    ("compositional", 3, 3, 2, "estimator"),  # the claim arm: JVP estimators, with every stabiliser
    ("compositional", 2, 2, 2, "estimator"),
    ("compositional", 3, 2, 2, "hvp"),        # the reported variants under the same stabilisers
    ("compositional", 3, 2, 2, "identity"),
    ("aucm", 2, 2, 3, "hvp"),
    ("ce", 2, 2, 3, "hvp"),
])
def test_jvp_estimators_and_libauc_stabilisers_equal_the_naive_reference(objective, L, K, I, jacobian):
    """Issue 29: the moving-average JVP estimators, the clip, the epoch-decay proximal term with its reference
    resets and the step decay, against the explicit-Hessian reference (decays after rounds 2 and 3 of 4)."""
    clients = _clients(K)
    hp = dict(eta0=0.3, lr_x=0.2, lr_y=0.1, beta=0.6, gamma=0.7)
    st = dict(jacobian=jacobian, jvp_beta=0.4, epoch_decay=0.5, decay_at=(2 * I, 3 * I), decay_factor=3.0)
    algo = FederatedCompositionalAUC(_net(), objective=objective, levels=L, local_steps=I, loss_version="v2",
                                     clip_value=0.05, **hp, **st)
    got = simulate(algo, clients, rounds=4, batch_size=8, seed=4).state
    ref = _naive_run(_net(), clients, objective=objective, L=L, I=I, rounds=4, seed=4, batch=8, clip=0.05, **hp, **st)
    torch.testing.assert_close(got["w"], ref["w"], rtol=1e-9, atol=1e-11)
    if objective != "ce":
        torch.testing.assert_close(got["ab"], torch.stack([ref["a"], ref["b"]]), rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(got["alpha"], ref["al"].reshape(1), rtol=1e-9, atol=1e-11)
    if jacobian == "estimator":
        assert algo.jvp_keys == [f"z{lvl}" for lvl in range(1, L)] and set(algo.jvp_keys) <= set(algo.comm_keys)
        for lvl in range(L - 1):
            torch.testing.assert_close(got[f"z{lvl + 1}"], ref["z"][lvl], rtol=1e-9, atol=1e-11)
    # and the stabilisers matter here: without them the run ends elsewhere
    plain = FederatedCompositionalAUC(_net(), objective=objective, levels=L, local_steps=I, loss_version="v2",
                                      jacobian=jacobian, jvp_beta=0.4, **hp)
    assert (simulate(plain, clients, rounds=4, batch_size=8, seed=4).state["w"] - got["w"]).abs().max() > 1e-4


def test_jvp_estimator_with_weight_one_is_the_exact_hvp_and_differs_below_one():
    clients = _clients(2)
    hp = dict(levels=3, eta0=0.4, lr_x=0.2, lr_y=0.1, beta=0.6, gamma=0.7, local_steps=2, loss_version="v2")
    hvp = simulate(FederatedCompositionalAUC(_net(), jacobian="hvp", **hp), clients, rounds=3, batch_size=8, seed=2)
    one = simulate(FederatedCompositionalAUC(_net(), jacobian="estimator", jvp_beta=1.0, **hp), clients, rounds=3,
                   batch_size=8, seed=2)
    half = simulate(FederatedCompositionalAUC(_net(), jacobian="estimator", jvp_beta=0.5, **hp), clients, rounds=3,
                    batch_size=8, seed=2)
    for k in ("w", "ab", "alpha", "m_w", "h1", "h2"):
        torch.testing.assert_close(one.state[k], hvp.state[k], rtol=1e-12, atol=1e-14)
    assert (half.state["w"] - hvp.state["w"]).abs().max() > 1e-4


def test_jvp_estimator_tracks_the_mean_exact_product_with_less_variance():
    """A frozen model (η_x = η_y = 1e-300 leave x, a, b, α unchanged in float64; β = 1) fed batches A, B, A, B, ...:
    the exact products J_Aᵀv_A and J_Bᵀv_B are constant, and z_1 = (1−β_J)z_1 + β_J·(exact product) settles into a
    2-cycle whose mean is their mean and whose swing is β_J/(2−β_J) of theirs (the moving average's variance
    reduction)."""
    (x, y), = _clients(1)
    A, B = (x[:8], y[:8]), (x[8:16], y[8:16])
    assert int(A[1].sum()) and int(B[1].sum())
    hp = dict(objective="compositional", levels=2, eta0=0.5, lr_x=1e-300, lr_y=1e-300, beta=1.0, gamma=1.0,
              local_steps=1, loss_version="v2")
    jb = 0.3
    est = FederatedCompositionalAUC(_net(), jacobian="estimator", jvp_beta=jb, **hp)
    exact = FederatedCompositionalAUC(_net(), jacobian="hvp", **hp)
    st, ref = est.init_state(), exact.init_state()
    w0 = st["w"].clone()
    for _ in range(60):
        zs, ps = [], []
        for xb, yb in (A, B):
            est.local_step(st, xb, yb)
            exact.local_step(ref, xb, yb)
            zs.append(st["z1"].clone())
            ps.append(ref["m_w"].clone())  # γ = 1: the momentum is this batch's exact product
    torch.testing.assert_close(st["w"], w0, rtol=0, atol=0)  # frozen
    assert (ps[0] - ps[1]).abs().max() > 1e-3  # the two batches' products differ
    torch.testing.assert_close((zs[0] + zs[1]) / 2, (ps[0] + ps[1]) / 2, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(zs[1] - zs[0], (ps[1] - ps[0]) * jb / (2 - jb), rtol=1e-8, atol=1e-10)


def test_identical_clients_follow_the_single_machine_trajectory():
    (x, y), = _clients(1)
    algo = FederatedCompositionalAUC(_net(), levels=3, local_steps=1, loss_version="v2", eta0=0.2, lr_x=0.2, lr_y=0.2)
    single = simulate(algo, [(x, y)], rounds=6, batch_size=8, client_seeds=[9],
                      callback=lambda r, s, f: s["w"].clone())
    fed = simulate(algo, [(x, y)] * 4, rounds=6, batch_size=8, client_seeds=[9] * 4,
                   callback=lambda r, s, f: s["w"].clone())
    for a, b in zip(single.callbacks, fed.callbacks, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    for st in fed.client_states[1:]:
        for k in algo.comm_keys:
            assert torch.equal(st[k], fed.client_states[0][k])


def test_averaging_conserves_the_mean_of_every_state_tensor():
    algo = FederatedCompositionalAUC(_net(), levels=4, loss_version="v2")
    g = torch.Generator().manual_seed(0)
    states = []
    for _ in range(5):
        st = algo.init_state()
        states.append({k: (t + torch.randn(t.shape, generator=g, dtype=t.dtype) if t.is_floating_point() else t)
                       for k, t in st.items()})
    avg = average_states(states, algo.comm_keys)
    assert set(algo.comm_keys) == {"w", "ab", "alpha", "m_w", "m_ab", "n", "h1", "h2", "h3"}
    for k in algo.comm_keys:
        before = torch.stack([s[k] for s in states]).mean(0)
        after = torch.stack([avg[k]] * 5).mean(0)
        torch.testing.assert_close(after, before, rtol=1e-14, atol=1e-14)
    assert algo.floats_per_client() == 5 * algo.num_params + 6  # w, m_w, h1..h3 + (a, b, α, m_a, m_b, n)


def _estimator_error(clients, *, beta: float, batch: int | None, steps: int) -> float:
    """Relative error of the synchronised h_1 against the pooled-data u_1(x) = x − η0∇L_CE(x), model frozen."""
    algo = FederatedCompositionalAUC(_net(), levels=2, eta0=0.5, beta=beta, loss_version="v2", jacobian="identity")
    states = [algo.init_state() for _ in clients]
    w0 = states[0]["w"].clone()
    gens = [torch.Generator().manual_seed(k) for k in range(len(clients))]
    for t in range(steps):
        for k, (x, y) in enumerate(clients):
            idx = torch.randint(len(y), (batch,), generator=gens[k]) if batch else torch.arange(len(y))
            algo.local_step(states[k], x[idx], y[idx])
            states[k]["w"] = w0.clone()  # frozen model
        if t % 2 == 1:  # averaging every I = 2 steps
            states = [average_states(states, algo.comm_keys) for _ in clients]
    xa, ya = torch.cat([c[0] for c in clients]), torch.cat([c[1] for c in clients])
    wr = w0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(algo._ce(wr, xa, ya), wr)
    return float((states[0]["h1"] - (w0 - 0.5 * g)).norm() / (0.5 * g).norm())


def test_estimator_converges_to_the_full_data_inner_map_for_a_frozen_model():
    clients = _clients(3, n=32)  # equal sizes: the mean of the clients' maps is the pooled-data map
    assert _estimator_error(clients, beta=0.1, batch=None, steps=100) < 1e-2  # full local batches: exact limit
    noisy = _estimator_error(clients, beta=1.0, batch=8, steps=60)
    averaged = _estimator_error(clients, beta=0.05, batch=8, steps=60)
    assert averaged < 0.5 * noisy  # the moving average removes most of the minibatch noise


# ------------------------------------------------------------------------------------------- simulator
def test_failed_client_is_excluded_logged_and_the_run_goes_on(caplog):
    clients = _clients(3)
    algo = FederatedCompositionalAUC(_net(), levels=2, local_steps=2, loss_version="v2")
    with caplog.at_level(logging.WARNING, logger="icml24.fed_auc"):
        res = simulate(algo, clients, rounds=3, batch_size=8, seed=2, fault=lambda r, k: 1 if (r, k) == (2, 1) else None,
                       callback=lambda r, s, f: {k: t.clone() for k, t in s.items()})
    assert res.participants == [[0, 1, 2], [0, 2], [0, 1, 2]]
    assert res.failures and res.failures[0][:2] == (2, 1) and "client 1 failed in round 2" in caplog.text
    # round 2's average is exactly the mean of clients 0 and 2 run from round 1's global state
    glob1 = res.callbacks[0]
    expected = []
    for k in (0, 2):
        g = client_generator(2, k)
        for _ in range(2):
            torch.randint(len(clients[k][1]), (8,), generator=g)  # round 1's batches
        st = {key: t.clone() for key, t in glob1.items()}
        for _ in range(2):
            idx = torch.randint(len(clients[k][1]), (8,), generator=g)
            algo.local_step(st, clients[k][0][idx], clients[k][1][idx])
        expected.append(st)
    avg = average_states(expected, algo.comm_keys)
    for key in algo.comm_keys:
        torch.testing.assert_close(res.callbacks[1][key], avg[key], rtol=0, atol=0)
    assert all(torch.isfinite(t).all() for t in res.state.values() if t.is_floating_point())
    assert res.floats_communicated == algo.floats_per_client() * (3 + 2 + 3)


def test_dropout_counts_participants_and_all_dropped_round_keeps_the_model():
    clients = _clients(4)
    algo = FederatedCompositionalAUC(_net(), objective="aucm", local_steps=1, loss_version="v2")
    res = simulate(algo, clients, rounds=20, batch_size=8, seed=3, dropout=0.5)
    n = sum(len(p) for p in res.participants)
    assert 0 < n < 80 and res.floats_communicated == n * algo.floats_per_client()
    w0 = algo.init_state()["w"]
    res2 = simulate(algo, clients, rounds=2, batch_size=8, seed=3, fault=lambda r, k: 0)
    assert res2.participants == [[], []] and torch.equal(res2.state["w"], w0)


def test_no_communication_trains_clients_independently():
    clients = _clients(2)
    algo = FederatedCompositionalAUC(_net(), levels=2, local_steps=2, loss_version="v2")
    res = simulate(algo, clients, rounds=2, batch_size=8, seed=0, communicate=False)
    assert res.floats_communicated == 0
    assert (res.client_states[0]["w"] - res.client_states[1]["w"]).abs().max() > 1e-6


def test_same_seed_same_numbers():
    clients = _clients(2)
    runs = [simulate(FederatedCompositionalAUC(_net(), levels=3, loss_version="v2", local_steps=2), clients, rounds=2,
                     batch_size=8, seed=s).state["w"] for s in (5, 5, 6)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


# ------------------------------------------------------------------------------------------- data
def test_task_is_imbalanced_and_split_is_non_iid():
    t = load_task("mnist1d", seed=0, imratio=0.05)
    assert abs(t.imratio - 0.05) < 0.005 and 0.04 < float(t.y_val.double().mean()) < 0.06
    assert set(t.y_test.unique().tolist()) == {0, 1}
    parts = dirichlet_split(t.y_train, num_clients=8, alpha=0.3, seed=0)
    assert sorted(torch.cat(parts).tolist()) == list(range(len(t.y_train)))
    pos = [int(t.y_train[p].sum()) for p in parts]
    assert min(pos) <= 0.2 * max(pos)  # some client nearly positive-free
    for name in ("make_classification", "breast_cancer"):
        s = load_task(name, seed=1, imratio=0.1)
        assert abs(s.imratio - 0.1) < 0.01 and s.x_train.shape[1] == s.x_test.shape[1]


# ------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw, err, match", [
    ({"levels": 1}, ValueError, "levels"),
    ({"lr_x": -0.1}, ValueError, "lr_x"),
    ({"lr_y": 0.0}, ValueError, "lr_y"),
    ({"eta0": -1.0}, ValueError, "eta0"),
    ({"margin": 0.0}, ValueError, "margin"),
    ({"local_steps": 0}, ValueError, "local_steps"),
    ({"beta": 1.5}, ValueError, "beta"),
    ({"gamma": 0.0}, ValueError, "gamma"),
    ({"objective": "hinge"}, ValueError, "objective"),
    ({"jacobian": "fd"}, ValueError, "jacobian"),
    ({"loss_version": "v1"}, ValueError, "imratio"),
    ({"loss_version": "v1", "imratio": 1.0}, ValueError, "imratio"),
    ({"objective": "aucm", "primal_from": "estimator"}, ValueError, "primal_from"),
])
def test_bad_algorithm_arguments_raise(kw, err, match):
    base = {"loss_version": "v2"}
    with pytest.raises(err, match=match):
        FederatedCompositionalAUC(_net(), **{**base, **kw})


def test_bad_client_data_raises_before_compute():
    algo = FederatedCompositionalAUC(_net(), levels=2, loss_version="v2")
    x = torch.randn(6, 5, dtype=DT)
    good = (x, torch.tensor([0, 1, 0, 0, 1, 0]))
    cases = [
        ([], ValueError, "number of clients K must be >= 1"),
        ([good, (x[:0], torch.zeros(0, dtype=torch.long))], ValueError, "client 1 has no data"),
        ([(x, torch.tensor([0, 2, 0, 0, 1, 0]))], ValueError, "binary"),
        ([(x, torch.zeros(6))], TypeError, "integer or bool"),
        ([(x, torch.zeros(6, dtype=torch.long))] * 2, ValueError, "no positive sample"),
        ([(x, torch.ones(5, dtype=torch.long))], ValueError, "same length"),
    ]
    for clients, err, match in cases:
        with pytest.raises(err, match=match):
            simulate(algo, clients, rounds=1)
    for kw, match in (({"rounds": 0}, "rounds"), ({"rounds": 1, "batch_size": 0}, "batch_size"),
                      ({"rounds": 1, "dropout": 1.0}, "dropout")):
        with pytest.raises(ValueError, match=match):
            simulate(algo, [good], **kw)
    with pytest.raises(TypeError, match="algo"):
        simulate(object(), [good], rounds=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_clients"):
        dirichlet_split(torch.tensor([0, 1]), num_clients=0, alpha=0.3, seed=0)
    with pytest.raises(ValueError, match="no data"):
        dirichlet_split(torch.tensor([0, 1]), num_clients=3, alpha=0.3, seed=0)
    with pytest.raises(ValueError, match="imratio"):
        load_task("mnist1d", seed=0, imratio=0.0)
    with pytest.raises(ValueError, match="name"):
        load_task("cifar10", seed=0)
