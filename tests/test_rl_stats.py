"""The shared rliable IQM helper: the point estimate, the seeding, the interval."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

pytest.importorskip("rliable")

from icml24.common.rl_stats import IQMEstimate, iqm_with_ci  # noqa: E402


def _scores(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"a": rng.normal(1.0, 1.0, (12, 3)), "b": rng.gamma(2.0, 1.0, (12, 3)), "c": rng.normal(0, 1, 10)}


def test_point_estimate_is_the_25_percent_trimmed_mean_of_the_flat_array():
    sc = _scores()
    out = iqm_with_ci(sc, reps=50, seed=0)
    assert list(out) == ["a", "b", "c"]
    for arm, x in sc.items():
        assert out[arm].iqm == pytest.approx(stats.trim_mean(np.ravel(x), 0.25), rel=0, abs=1e-12)
        assert isinstance(out[arm], IQMEstimate) and out[arm].as_dict()["iqm"] == out[arm][0]


def test_same_seed_same_interval_whatever_the_global_rng_and_the_other_arms():
    sc = _scores()
    np.random.seed(123)
    first = iqm_with_ci(sc, reps=300, seed=7)
    np.random.seed(999)
    np.random.random(17)
    again = iqm_with_ci(sc, reps=300, seed=7)
    assert first == again
    alone = iqm_with_ci({"b": sc["b"]}, reps=300, seed=7)
    reordered = iqm_with_ci({"c": sc["c"], "b": sc["b"]}, reps=300, seed=7)
    assert alone["b"] == first["b"] == reordered["b"]
    other = iqm_with_ci(sc, reps=300, seed=8)
    assert other["a"].iqm == first["a"].iqm and (other["a"].lo, other["a"].hi) != (first["a"].lo, first["a"].hi)


def test_the_global_rng_state_is_restored():
    np.random.seed(5)
    expected = np.random.random(3)
    np.random.seed(5)
    iqm_with_ci(_scores(), reps=100, seed=1)
    np.testing.assert_array_equal(np.random.random(3), expected)


def test_the_interval_contains_the_iqm_and_narrows_with_more_runs():
    rng = np.random.default_rng(3)
    small, big = rng.normal(0, 1, (8, 2)), rng.normal(0, 1, (200, 2))
    out = iqm_with_ci({"small": small, "big": big}, reps=500, seed=0)
    for e in out.values():
        assert e.lo <= e.iqm <= e.hi and e.lo < e.hi
    assert out["big"].hi - out["big"].lo < out["small"].hi - out["small"].lo
    wide = iqm_with_ci({"small": small}, reps=500, seed=0, confidence=0.99)["small"]
    assert wide.lo <= out["small"].lo and wide.hi >= out["small"].hi


def test_torch_and_list_inputs_and_constant_scores():
    torch = pytest.importorskip("torch")
    x = np.arange(20.0).reshape(10, 2)
    a = iqm_with_ci({"np": x, "torch": torch.as_tensor(x), "list": x.tolist()}, reps=50, seed=0)
    assert a["np"] == a["torch"] == a["list"]
    const = iqm_with_ci({"k": np.full((5, 2), 3.0)}, reps=50, seed=0)["k"]
    assert const == (3.0, 3.0, 3.0)


@pytest.mark.parametrize("kw, match", [
    ({"scores": {}}, "empty"),
    ({"scores": {"a": np.zeros((0, 2))}}, "non-empty"),
    ({"scores": {"a": np.zeros((2, 2, 2))}}, "runs × tasks"),
    ({"scores": {"a": [1.0, np.nan]}}, "non-finite"),
    ({"reps": 0}, "reps"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"confidence": 1.0}, "confidence"),
])
def test_bad_arguments(kw, match):
    args = {"scores": {"a": np.ones((4, 2))}, "reps": 10, "seed": 0} | kw
    with pytest.raises(ValueError, match=match):
        iqm_with_ci(args.pop("scores"), **args)
