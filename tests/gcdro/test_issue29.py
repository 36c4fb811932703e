"""Issue 29, gcdro "in their ecosystems": the default k on small data (scikit-learn's checks) and the torch kNN
graph of the minibatch weighter (same graph as scikit-learn's, built on the batch's device)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.sparse.csgraph import connected_components
from sklearn.utils.estimator_checks import (
    check_estimators_nan_inf,
    check_fit2d_1feature,
    check_regressors_no_decision_function,
)

from icml24.gcdro import GCDRORegressor, GCDROWeighter, core


# ------------------------------------------------------------------------- 5. default k on small data
@pytest.mark.parametrize("check", [check_estimators_nan_inf, check_regressors_no_decision_function,
                                   check_fit2d_1feature])
def test_default_n_neighbors_passes_the_checks_that_use_ten_samples(check):
    """The three scikit-learn checks that failed with the default k = 10 on their 10-sample data."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check("GCDRORegressor", GCDRORegressor(max_iter=20, lr=0.05))


@pytest.mark.parametrize("n", [2, 5, 10, 11])
def test_default_n_neighbors_is_clipped_to_n_minus_one(n):
    rng = np.random.default_rng(n)
    x, y = rng.normal(size=(n, 3)), rng.normal(size=n)
    est = GCDRORegressor(max_iter=3).fit(x, y)
    assert est.n_neighbors == 10 and est.n_neighbors_ == min(10, n - 1)
    assert connected_components(est.graph_, directed=False)[0] == 1
    assert np.isfinite(est.predict(x)).all()


def test_one_sample_is_still_refused():
    with pytest.raises(ValueError, match="n_samples"):
        GCDRORegressor(max_iter=3).fit(np.ones((1, 2)), np.ones(1))


# ------------------------------------------------------------------------------- 6. torch kNN graph
def _ref_edges(x: np.ndarray, **kw) -> core.EdgeList:
    return core.EdgeList.from_adjacency(core.knn_graph(x, **kw))


@pytest.mark.parametrize("n, d, k, sigma", [(50, 4, 6, None), (257, 8, 10, None), (100, 2, 5, 0.7),
                                             (30, 3, 29, None), (12, 1, 1, None)])
def test_knn_edges_equal_the_scikit_learn_graph(n, d, k, sigma):
    x = np.random.default_rng(n + d).normal(size=(n, d))  # continuous data: no ties
    ref = _ref_edges(x, n_neighbors=k, sigma=sigma)
    new = core.knn_edges(torch.as_tensor(x), n_neighbors=k, sigma=sigma)
    assert new.n == ref.n and torch.equal(new.nbr, ref.nbr)  # the same neighbours, in the same slots
    torch.testing.assert_close(new.w, ref.w, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(new.degree, ref.degree, rtol=1e-12, atol=1e-15)


def test_knn_edges_double_k_until_connected_as_the_scikit_learn_graph():
    rng = np.random.default_rng(3)
    x = np.r_[rng.normal(size=(20, 2)), rng.normal(size=(25, 2)) + 40.0]  # two far clusters
    ref, new = _ref_edges(x, n_neighbors=3), core.knn_edges(torch.as_tensor(x), n_neighbors=3)
    assert torch.equal(new.nbr, ref.nbr)
    torch.testing.assert_close(new.w, ref.w, rtol=1e-9, atol=1e-15)
    apart = core.knn_edges(torch.as_tensor(x), n_neighbors=3, ensure_connected=False)
    assert core._components_torch(apart.nbr, apart.w) == 2 and core._components_torch(new.nbr, new.w) == 1


def test_knn_edges_keep_duplicate_rows_with_weight_one():
    x = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 1.0]], dtype=torch.float64)
    e = core.knn_edges(x, n_neighbors=1)
    w = torch.zeros(5, 5, dtype=torch.float64)
    w[torch.arange(5).unsqueeze(1), e.nbr] += e.w
    assert float(w[0, 1]) == 1.0 and float(w[1, 0]) == 1.0  # distance 0 is an edge of weight exp(0)
    torch.testing.assert_close(w, w.T)


def test_knn_edges_bad_input():
    with pytest.raises(ValueError, match="n_neighbors"):
        core.knn_edges(torch.randn(5, 2), n_neighbors=5)
    with pytest.raises(ValueError, match="NaN"):
        core.knn_edges(torch.tensor([[0.0], [float("nan")], [1.0]]), n_neighbors=1)
    with pytest.raises(ValueError, match="x"):
        core.knn_edges(torch.ones(4, dtype=torch.float64), n_neighbors=1)


def test_weighter_builds_its_graph_in_torch_without_scikit_learn(monkeypatch):
    g = torch.Generator().manual_seed(4)
    feats, losses = torch.randn(64, 3, generator=g), torch.rand(64, generator=g) + 0.5
    z = feats.double().numpy()
    z = (z - z.mean(0)) / z.std(0)
    ref = core.gradient_flow(losses.double() / losses.double().mean(), _ref_edges(z, n_neighbors=7), alpha=1.0,
                             beta=0.1, n_steps=10, step_scale=0.5)

    def no_sklearn(*a, **kw):
        raise AssertionError("the weighter must not call scikit-learn's kNN graph")

    monkeypatch.setattr(core, "knn_graph", no_sklearn)
    monkeypatch.setattr(core, "kneighbors_graph", no_sklearn)
    q = GCDROWeighter(n_neighbors=7).update(losses, feats)
    assert q.dtype == losses.dtype
    torch.testing.assert_close(q, (ref / ref.sum()).float())


# ------------------------------------------------------------------ D2: the minority is a region of x
def test_region_minority_is_the_region_x1_above_the_cut():
    from scipy.stats import norm

    from icml24.gcdro import subpopulation_regression

    rng = np.random.default_rng(0)
    x, y, g = subpopulation_regression(n=20_000, rng=rng, minority=0.1, noise=0.0)
    cut = norm.ppf(0.9)
    assert abs(cut - 1.2816) < 1e-3
    np.testing.assert_array_equal(g, (x[:, 0] > cut).astype(int))
    assert abs(g.mean() - 0.1) < 0.01
    # its own slope there: y = x·(1, 0.1) on the minority, x·(1, 1) elsewhere
    np.testing.assert_allclose(y[g == 1], x[g == 1] @ np.array([1.0, 0.1]), atol=1e-12)
    np.testing.assert_allclose(y[g == 0], x[g == 0] @ np.array([1.0, 1.0]), atol=1e-12)
    for group, side in (("minority", 1), ("majority", 0)):
        xg, _, gg = subpopulation_regression(n=5000, rng=rng, group=group)
        assert (gg == side).all() and ((xg[:, 0] > cut) == bool(side)).all()
        # the conditional law of x₁ is the truncated normal's (mean φ(c)/(1−Φ(c)) on the minority side)
        want = norm.pdf(cut) / (1 - norm.cdf(cut)) if side else -norm.pdf(cut) / norm.cdf(cut)
        assert abs(xg[:, 0].mean() - want) < 0.05 and abs(xg[:, 1].std() - 1.0) < 0.05


def test_region_minority_is_a_region_of_the_knn_graph_and_the_independent_one_is_not():
    """GCDRO's geometric term acts on the kNN graph of x: the region minority's neighbours are mostly minority,
    the independent (DN20_2) minority's are the population's 10%."""
    from icml24.gcdro import subpopulation_regression

    share = {}
    for layout in ("region", "independent"):
        x, _, g = subpopulation_regression(n=600, rng=np.random.default_rng(1), layout=layout)
        e = core.knn_edges(torch.as_tensor(x), n_neighbors=10)
        nbr, w = e.nbr.numpy(), e.w.numpy()
        m = g == 1
        share[layout] = float(((g[nbr] == 1) * (w > 0))[m].sum() / (w > 0)[m].sum())
    assert share["region"] > 0.7 and share["independent"] < 0.25, share


def test_subpopulation_regression_bad_input():
    from icml24.gcdro import subpopulation_regression

    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="layout"):
        subpopulation_regression(n=10, rng=rng, layout="cluster")
    with pytest.raises(ValueError, match="group"):
        subpopulation_regression(n=10, rng=rng, group="both")
    with pytest.raises(ValueError, match="minority"):
        subpopulation_regression(n=10, rng=rng, minority=1.0)


def test_d2_regime_uses_the_baselines_only(monkeypatch):
    """The D2 regime guard's statistics come from ERM and the DRO baselines (never GCDRO): the noise-free D2 tuned by
    D2's declared rule, then KL and χ² refit at their noise-free picks on the noisy labels."""
    from icml24.common.seeding import numpy_generator
    from icml24.gcdro import experiment as ex

    cfg = ex.Config.quick().replace(n_train=80, n_val=60, n_test=60, n_select=40, max_iter=40)
    built = []
    real = ex.make_estimator

    def spy(cfg_, arm, value, seed):
        built.append(arm)
        return real(cfg_, arm, value, seed)

    monkeypatch.setattr(ex, "make_estimator", spy)
    d2 = ex.d2_data(cfg, numpy_generator(5), numpy_generator(6))
    assert (d2["y"] != d2["y_clean"]).sum() == round(cfg.noise_frac * cfg.n_train)  # the gross noise only
    xv, yv, yv_clean, gv = d2["val"]
    assert (yv != yv_clean).any()
    erm = real(cfg, "erm", 0.0, 5).fit(d2["x"], d2["y"])
    for key, yy in (("score", yv), ("score_clean", yv_clean)):  # the noise-free run validates on clean labels
        sc = d2[key](erm)
        assert sc[ex.TRAIN_VAL] == pytest.approx(float(np.sqrt(np.mean((erm.predict(xv) - yy) ** 2))), rel=1e-12)
        worst = max(float(np.sqrt(np.mean((erm.predict(xv[gv == g]) - yy[gv == g]) ** 2))) for g in (0, 1))
        assert sc[ex.WORST_GROUP] == pytest.approx(worst, rel=1e-12)
    reg = ex.d2_regime(cfg, 5, d2)
    assert "gcdro" not in built and set(built) == {"erm", *ex.REGIME_ARMS}
    m = reg["metrics"]
    assert reg["selected"] in ex.REGIME_ARMS and reg["selected"] != "erm"
    assert reg["selected"] == min(ex.REGIME_ARMS, key=lambda a: m[a]["d2_clean_select_score"])
    assert m[ex.BEST]["d2_clean_dro_rmse_minority"] == m[reg["selected"]]["d2_clean_rmse_minority"]
    rule = ex.selection_rules(cfg, "d2")[0]
    for arm in ex.PESSIMISM_ARMS:
        assert m[arm]["d2_clean_param"] == reg["tuning"][arm]["picked"]
        refit = d2["score"](real(cfg, arm, m[arm]["d2_clean_param"], 5).fit(d2["x"], d2["y"]))
        assert m[arm]["d2_noisy_at_clean_pick_rmse_minority"] == refit["d2_rmse_minority"]
        clean = d2["score_clean"](real(cfg, arm, m[arm]["d2_clean_param"], 5).fit(d2["x"], d2["y_clean"]))
        assert m[arm]["d2_clean_rmse_minority"] == clean["d2_rmse_minority"]  # tuned on the clean labels
        assert m[arm]["d2_clean_select_score"] == clean[rule]
