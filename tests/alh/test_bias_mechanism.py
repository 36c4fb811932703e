"""Issue 30: the bias story as mechanisms beside the verdict (never a gate on the claims), the unbiased arms'
exploration noise, the slow tier's settings."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as st

import icml24.alh.experiment as ex
from icml24.alh.experiment import Config, bias_interaction, bias_mechanisms
from tests.alh.test_repro import _fake_run_one

SEEDS = (0, 1, 2, 3)
# synthetic per-seed final returns: every formula other than (G_b − T_b) − (G_u − T_u) gives other numbers
FINAL = {"td3": [-10.0, -8.0, -6.0, -5.0], "alh_g": [-2.0, -1.0, -4.0, -5.0],
         "td3_unbiased": [-3.0, -9.0, -2.0, -6.0], "alh_g_unbiased": [-4.0, -5.0, -3.0, -6.0]}


def _final():
    return {a: dict(zip(SEEDS, v, strict=True)) for a, v in FINAL.items()}


def test_the_interaction_is_computed_per_seed_and_paired():
    values = bias_interaction(_final(), SEEDS)
    assert values == [9.0, 3.0, 3.0, 0.0]  # (8 − (−1)), (7 − 4), (2 − (−1)), (0 − 0)
    td3_mech, inter = bias_mechanisms(Config(seeds=SEEDS), _final())
    assert inter.kind == "mechanism" and inter.method_arm == "alh_g" and inter.n == 4 and inter.guards == []
    lo, hi = st.t.interval(0.95, 3, loc=np.mean(values), scale=st.sem(values))
    assert inter.measured == pytest.approx(3.75) and (inter.ci_low, inter.ci_high) == pytest.approx((lo, hi))
    assert inter.threshold == 0.0 and inter.direction == ">=" and inter.passed == (lo > 0)
    # TD3 unbiased − TD3 biased, paired per seed: [7, −1, 4, −1]
    d = np.subtract(FINAL["td3_unbiased"], FINAL["td3"])
    lo, hi = st.t.interval(0.95, 3, loc=d.mean(), scale=st.sem(d))
    assert td3_mech.kind == "mechanism" and td3_mech.guards == [] and td3_mech.measured == pytest.approx(2.25)
    assert (td3_mech.method_arm, td3_mech.baseline_arm) == ("td3_unbiased", "td3")
    assert (td3_mech.ci_low, td3_mech.ci_high) == pytest.approx((lo, hi)) and not td3_mech.passed
    # a clearly positive interaction passes, its mirror image fails
    big = _final()
    big["alh_g"] = {s: v + 20.0 for s, v in big["alh_g"].items()}
    assert bias_mechanisms(Config(seeds=SEEDS), big)[1].passed
    big["alh_g"] = {s: v - 40.0 for s, v in big["alh_g"].items()}
    assert not bias_mechanisms(Config(seeds=SEEDS), big)[1].passed
    # only the arms that ran: TD3 alone gives its mechanism only; unbiased main arms have no bias to compare
    assert len(bias_mechanisms(Config(seeds=SEEDS, unbiased_arms=("td3",)), _final())) == 1
    assert bias_mechanisms(Config(seeds=SEEDS, unbiased_arms=()), _final()) == []
    assert bias_mechanisms(Config(seeds=SEEDS, biased=False), _final()) == []


@pytest.mark.parametrize("unbiased", [-5.0, 5.0])
def test_the_claims_are_not_guarded_by_the_bias_mechanisms(tmp_path, monkeypatch, unbiased):
    """The unbiased data hurting TD3 (-5) fails both mechanisms, helping it (+5) passes TD3's; the claims vote
    either way (issue 30: the bias is a mechanism, not a gate)."""
    monkeypatch.setattr(ex, "run_one", _fake_run_one({"td3": 1e-3, "alh_g": 1e-3}, unbiased=unbiased))
    cfg = Config.quick().replace(lr_grid=(3e-4, 1e-3, 3e-3), seeds=(0, 1, 2), val_seeds=(50, 51))
    res = ex.run(cfg, tmp_path)
    claims = res.checks("claim")
    assert len(claims) == 2 and all(c.passed and c.void_by == [] for c in claims)
    td3_mech, inter = res.checks("mechanism")
    assert td3_mech.passed == (unbiased > 0) and inter.passed  # gain 1 on biased, 0 on unbiased data
    assert inter.measured == pytest.approx(1.0)
    sanity = res.checks("sanity")  # tuning and convergence only: nothing on the unbiased arms guards a claim
    assert len(sanity) == 3 and all("inside its grid" in c.name or "finite" in c.name for c in sanity)
    assert all(c.method_arm in (None, "td3", "alh_g") and c.baseline_arm is None for c in sanity)
    assert res.verdict["label"] == "holds" and res.verdict["mechanisms_total"] == 2
    assert res.verdict["mechanisms_held"] == 1 + (unbiased > 0)


def test_the_unbiased_arms_train_with_the_official_exploration_noise(tmp_path, monkeypatch):
    """Every run on the unbiased data gets ``unbiased_expl_noise`` (official share_not_hard_config: 0.1), every
    run on the biased data ``expl_noise`` (0), through run() -> run_one() -> train()."""
    assert Config().unbiased_expl_noise == 0.1 and Config().expl_noise == 0.0
    assert ex.expl_noise(Config(), biased=False) == 0.1 and ex.expl_noise(Config(), biased=True) == 0.0
    seen = []

    def fake_train(*, agent, env, eval_env, expl_noise, **kw):
        seen.append((env.biased, eval_env.biased, expl_noise))
        return {"steps": [0, 1, 2], "returns": [0.0, 1.0, 1.0], "critic_loss": [0.0] * 3, "finite": True,
                "episodes": 1}

    monkeypatch.setattr(ex, "train", fake_train)
    cfg = Config.quick().replace(unbiased_expl_noise=0.25, lr_grid=(1e-3,))  # not the default: the field is used
    ex.run(cfg, tmp_path)
    assert sorted(seen) == sorted([(True, False, 0.0)] * 2 * 3 + [(False, False, 0.25)] * 2 * 2)
    with pytest.raises(ValueError, match="unbiased_expl_noise"):
        Config(unbiased_expl_noise=-0.1)


def test_config_arms_validation():
    with pytest.raises(ValueError, match="unbiased_arms"):
        Config(unbiased_arms=("td3", "alh_a"))  # ALH-a is not among the default test arms
    with pytest.raises(ValueError, match="must hold td3"):
        Config(test_arms=("alh_g",), unbiased_arms=(), tune_arms=("alh_g",))
    with pytest.raises(ValueError, match="tune_arms"):
        Config(tune_arms=("td3", "alh_a"))
    assert Config().workers == 2 and Config().test_arms == ("td3", "alh_g")


def test_the_slow_tier_is_the_official_toy_protocol_at_75k_steps():
    c = Config.slow_bias()
    assert c.total_steps >= 75_000 and c.start_steps == 25_000 and c.eval_every == 5_000 and c.eval_episodes == 10
    assert (c.batch_size, c.subset_size, c.hidden, c.mem_hidden, c.hypo_dim) == (512, 128, 64, 64, 64)
    assert c.seeds == tuple(range(10)) and c.test_arms == ("td3", "alh_g") == c.unbiased_arms
    assert c.biased and c.expl_noise == 0.0 and c.unbiased_expl_noise == 0.1 and c.lr_grid == Config().lr_grid
    # the command line documented in the README gives the same Config
    cli = {"total_steps": "75000", "eval_every": "5000", "batch_size": "512", "subset_size": "128"}
    assert Config().with_overrides(cli) == c
