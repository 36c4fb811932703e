"""E3's fixed-n regime grid, E4's k-fold selection inside the public pool, and the regime pilot (issue 29)."""

from __future__ import annotations

import pytest
import torch

import icml24.dp_public.experiment as ex
from icml24.dp_public.experiment import Config, digits_split, pilot, run_digits, run_linear

TINY_LIN = dict(lin_dim=10, lin_n=300, lin_n_pubs=(30, 60), lin_epsilons=(0.5, 1.0), lin_steps=5, lin_n_test=200,
                lin_betas=(0.9,), lin_lrs=(0.3, 0.9), grid_extra=0, workers=1)
TINY_DIG = dict(dig_steps=10, dig_folds=3, dig_lrs=(0.3, 1.0), dig_epsilons=(1.0,), grid_extra=0, workers=1)


def _record_calls(monkeypatch):
    calls: list[tuple[str, int, int]] = []
    orig = ex.train_semi_dp

    def spy(model, loss, **kw):
        calls.append((kw["mode"], len(kw["x_pub"]), len(kw["x_priv"])))
        return orig(model, loss, **kw)
    monkeypatch.setattr(ex, "train_semi_dp", spy)
    return calls


def test_e3_keeps_n_fixed_and_an_arm_does_not_depend_on_the_others(monkeypatch):
    cfg = Config(**TINY_LIN)
    calls = _record_calls(monkeypatch)
    full = {k: run_linear(cfg, 3, k) for k in cfg.lin_n_pubs}
    for k, cells in full.items():
        assert set(cells) == set(cfg.lin_epsilons)
        for cell in cells.values():
            assert cell["n_pub"] == k and cell["n_priv"] == cfg.lin_n - k
        # the reference draws no noise: tuned once per n_pub, shared by every ε
        assert cells[0.5]["non_private"] == cells[1.0]["non_private"]
    # private-side sizes: n_priv = n − n_pub in every training run
    assert {(n_pub, n_priv) for _, n_pub, n_priv in calls if n_pub in (30, 60)} <= {(30, 270), (60, 240)}
    # each arm has its own generator: DP-GD's numbers are the same when only the pilot's arms run
    calls.clear()
    only = run_linear(cfg, 3, 30, arms=("dp_gd_all", "non_private"))
    assert {m for m, _, _ in calls} == {"dp_sgd_all", "public_only"}  # never the method
    for e in cfg.lin_epsilons:
        assert only[e]["dp_gd_all"] == full[30][e]["dp_gd_all"] and "semi_dp" not in only[e]
        assert only[e]["non_private"] == full[30][e]["non_private"]
    with pytest.raises(ValueError, match="run_linear arms"):
        run_linear(cfg, 3, 30, arms=("public_only",))


def test_digits_folds_partition_the_public_pool():
    cfg = Config(**TINY_DIG)
    d = digits_split(cfg, 0)
    folds = [set(f.tolist()) for f in d["folds"]]
    assert len(folds) == cfg.dig_folds and set().union(*folds) == set(d["pool"].tolist())
    assert sum(len(f) for f in folds) == len(d["pool"])  # disjoint
    assert not set(d["pool"].tolist()) & set(d["priv"].tolist())
    with pytest.raises(ValueError, match="dig_folds"):
        digits_split(Config(dig_folds=60), 0)


def test_every_e4_arm_is_selected_by_k_fold_cv_then_refit_on_the_whole_pool(monkeypatch):
    cfg = Config(**TINY_DIG)
    d = digits_split(cfg, 1)
    pool, n_priv = len(d["pool"]), len(d["priv"])
    fold_sizes = sorted(len(f) for f in d["folds"])
    calls = _record_calls(monkeypatch)
    for eps, arms in ((None, ("public_only", "non_private")), (1.0, ("dp_sgd_all", "semi_dp"))):
        calls.clear()
        out = run_digits(cfg, 1, eps)
        for arm in arms:
            t = out["tuned"][arm]
            assert all(len(t.records[v]["val"]) == cfg.dig_folds for v in t.grid), arm  # one score per fold
            assert 0.0 <= out[arm] <= 100.0
        for arm in arms:
            mode = "public_only" if arm in ("public_only", "non_private") else arm
            extra = n_priv if arm == "non_private" else 0  # the reference adds the private data to its "public"
            sizes = [p - extra for m, p, _ in calls if m == mode and (arm != "public_only" or p < n_priv)
                     and (arm != "non_private" or p >= n_priv)]
            n_cfg = len(out["tuned"][arm].grid)
            # every configuration is trained once per fold without that fold, the pick once on the whole pool
            assert sorted(sizes) == sorted([pool - s for s in fold_sizes] * n_cfg + [pool]), arm
        assert all(p_priv == n_priv for _, _, p_priv in calls)
    with pytest.raises(ValueError, match="run_digits arms"):
        run_digits(cfg, 1, None, arms=("semi_dp",))


def test_pilot_runs_only_the_baselines_on_other_seeds(monkeypatch):
    cfg = Config(seeds=(0,), **{**TINY_LIN, **TINY_DIG})
    with pytest.raises(ValueError, match="seeds the full run does not"):
        pilot(cfg, (0, 7))
    calls = _record_calls(monkeypatch)
    out = pilot(cfg, (7, 8))
    assert {m for m, _, _ in calls} == {"dp_sgd_all", "public_only"}  # never semi_dp
    assert set(out["E3"]) == {f"n_pub={k} eps={e:g}" for k in cfg.lin_n_pubs for e in cfg.lin_epsilons}
    for row in out["E3"].values():
        assert set(row) == {"throw_away", "dp_gd_all", "non_private", "log_dp_gd_over_non_private",
                            "log_throw_away_over_non_private"} and len(row["dp_gd_all"]) == 2
        assert row["log_dp_gd_over_non_private"] == pytest.approx(
            float(torch.tensor(row["dp_gd_all"], dtype=torch.float64).div(
                torch.tensor(row["non_private"], dtype=torch.float64)).log().mean()))
    assert set(out["E4"]) == {"eps=1"} and len(out["E4"]["eps=1"]["dp_sgd_all"]) == 2


def test_closed_form_linear_gradients_equal_torch_func_and_train_the_same():
    from icml24.dp_public import per_sample_grads
    from icml24.dp_public.experiment import _ce, _sq_loss, linear_ce_grads, linear_sq_grads
    from icml24.dp_public.semi_dp import train_semi_dp

    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(9, 6, generator=g), torch.randint(0, 4, (9,), generator=g)
    m = torch.nn.Linear(6, 4)
    for a, b in zip(linear_ce_grads(m)(x, y), per_sample_grads(m, _ce, x, y), strict=True):
        torch.testing.assert_close(a, b)
    lin = torch.nn.Linear(6, 1, bias=False)
    yr = torch.randn(9, generator=g)
    for a, b in zip(linear_sq_grads(lin)(x, yr), per_sample_grads(lin, _sq_loss, x, yr), strict=True):
        torch.testing.assert_close(a, b)
    # the hook is used by train_semi_dp: the same run with either path (same generator) ends at the same weights
    xp, yp = torch.randn(40, 6, generator=g), torch.randint(0, 4, (40,), generator=g)
    ws = []
    for fast in (False, True):
        torch.manual_seed(0)
        mm = torch.nn.Linear(6, 4)
        with pytest.warns(UserWarning):
            train_semi_dp(mm, _ce, mode="semi_dp", x_priv=xp, y_priv=yp, x_pub=x, y_pub=y, epsilon=1.0, delta=1e-5,
                          steps=5, lr=0.5, beta=0.5, batch_size=8, public_batch_size=4,
                          generator=torch.Generator().manual_seed(1),
                          grad_sample_fn=linear_ce_grads(mm) if fast else None)
        ws.append(mm.weight.detach().clone())
    torch.testing.assert_close(ws[0], ws[1])
    assert not torch.equal(ws[0], torch.nn.Linear(6, 4).weight)


def test_train_semi_dp_calls_the_given_grad_sample_fn_once_per_step():
    from icml24.dp_public import per_sample_grads
    from icml24.dp_public.experiment import _ce
    from icml24.dp_public.semi_dp import train_semi_dp

    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(30, 4, generator=g), torch.randint(0, 3, (30,), generator=g)
    m = torch.nn.Linear(4, 3)
    seen: list[int] = []

    def fn(xb, yb):
        seen.append(len(xb))
        return per_sample_grads(m, _ce, xb, yb)
    train_semi_dp(m, _ce, mode="public_only", x_priv=x[10:], y_priv=y[10:], x_pub=x[:10], y_pub=y[:10],
                  epsilon=1.0, delta=1e-5, steps=4, lr=0.1, public_batch_size=5, grad_sample_fn=fn)
    assert seen == [5, 5, 5, 5]


def test_every_e3_arm_is_selected_by_k_fold_cv_then_refit_on_all_public_points(monkeypatch):
    """Amendment 6: k-fold CV inside the n_pub public points (no separate validation split), the fold's warm start
    from the fold's own training points, the pick refit on all n_pub points (warm start: throw-away LS)."""
    cfg = Config(**{**TINY_LIN, "lin_n_pubs": (30,), "lin_epsilons": (0.5,), "lin_folds": 3})
    n_pub, n_priv = 30, cfg.lin_n - 30
    seen: list[tuple[str, int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
    orig = ex.train_semi_dp

    def spy(model, loss, **kw):
        seen.append((kw["mode"], len(kw["x_pub"]), model.weight.detach()[0].clone(), kw["x_pub"], kw["y_pub"]))
        return orig(model, loss, **kw)
    monkeypatch.setattr(ex, "train_semi_dp", spy)
    out = run_linear(cfg, 2, n_pub)[0.5]
    for arm in ex.LIN_TUNED:
        t = out["tuned"][arm]
        assert all(len(t.records[v]["val"]) == cfg.lin_folds for v in t.grid), arm  # one score per fold
        assert out[arm] > 0
    fold_train = n_pub - 10  # 3 folds of 10
    n_cfg = {a: len(out["tuned"][a].grid) for a in ("dp_gd_all", "semi_dp_beta_eq", "non_private")}
    sizes = {}
    for mode, k, *_ in seen:
        k = k - n_priv if k >= n_priv else k  # the reference's "public" rows carry the private data too
        sizes.setdefault(mode, []).append(k)
    assert set(sizes["dp_sgd_all"]) == {fold_train, n_pub}
    assert sizes["dp_sgd_all"].count(n_pub) == 1 and sizes["dp_sgd_all"].count(fold_train) == 3 * n_cfg["dp_gd_all"]
    ref = sizes["public_only"]
    assert ref.count(n_pub) == 1 and ref.count(fold_train) == 3 * n_cfg["non_private"]
    assert sizes["semi_dp"].count(n_pub) == 2  # the two semi-DP arms' refits; all else are folds
    assert set(sizes["semi_dp"]) == {fold_train, n_pub}
    # warm start = least squares on the public points the run trains with (never on its held-out fold)
    for mode, _, w0, xq, yq in seen:
        if mode == "public_only":  # the reference: drop the private rows in front
            xq, yq = xq[n_priv:], yq[n_priv:]
        torch.testing.assert_close(w0, torch.linalg.solve(xq.T @ xq, xq.T @ yq), rtol=1e-4, atol=1e-4)
    # the held-out folds partition the public points and the validation score is the held-out fold's MSE
    folds = ex.kfold(torch.arange(n_pub), cfg.lin_folds)
    assert sorted(torch.cat(folds).tolist()) == list(range(n_pub))
    assert ex.cv_scores(lambda rest, fold: len(set(rest.tolist()) & set(fold.tolist())) + 0.5 * len(rest),
                        folds) == [10.0, 10.0, 10.0]


def test_lin_folds_must_leave_more_public_points_than_dimensions():
    with pytest.raises(ValueError, match="lin_folds"):
        Config(lin_n_pubs=(55,), lin_folds=5)  # 44 points per fold <= p = 50
    assert Config().lin_folds == 5


def test_the_amendment_6_run_uses_fresh_seeds():
    seeds = set(Config().seeds)
    assert len(seeds) == 5 and not seeds & {0, 1, 2, 3, 4} and not seeds & {100, 101, 102}


def test_e3_validation_score_is_the_held_out_folds_mse(monkeypatch):
    cfg = Config(**{**TINY_LIN, "lin_n_pubs": (30,), "lin_epsilons": (0.5,), "lin_folds": 3})
    runs: list[tuple[float, torch.Tensor, torch.Tensor, torch.Tensor]] = []
    orig = ex.train_semi_dp

    def spy(model, loss, **kw):
        res = orig(model, loss, **kw)
        if kw["mode"] == "dp_sgd_all":
            runs.append((kw["lr"], model.weight.detach()[0].clone(), kw["x_pub"], kw["y_pub"]))
        return res
    monkeypatch.setattr(ex, "train_semi_dp", spy)
    t = run_linear(cfg, 4, 30, arms=("dp_gd_all",))[0.5]["tuned"]["dp_gd_all"]
    x_all, y_all = next((x, y) for _, _, x, y in runs if len(x) == 30)  # the refit sees every public point
    expect: dict[float, list[float]] = {}
    for lr, w, xq, _ in runs:
        if len(xq) == 30:
            continue
        held = torch.tensor([not any(torch.equal(r, q) for q in xq) for r in x_all])
        assert int(held.sum()) == 10  # the fold's 10 points, never trained on
        expect.setdefault(lr, []).append(float(((x_all[held] @ w - y_all[held]) ** 2).mean()))
    for v in t.grid:
        assert t.records[v]["val"] == pytest.approx(expect[v], rel=1e-6)
