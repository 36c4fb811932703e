"""The jobs of icl_theory run in ``workers`` processes give exactly the numbers of the serial path."""

from __future__ import annotations

import json

import pytest

from icml24.icl_theory.experiment import Config, _part3_arms, run


def _tiny() -> Config:
    return Config.quick().replace(
        seeds=(0, 1), d_grid=(4,), M_grid=(1, 4), T_grid=(8, 32), reps_total=16, min_reps=4, sub_cells=(4, 8, 8, 8),
        sub_reps=3, sub_grid=600, icl_M=(16, 64), icl_steps=12, icl_eval_every=4, icl_val=16, icl_eval=32,
        threads=1)


def _numbers(out) -> dict:
    d = json.loads((out / "results.json").read_text())
    for key in ("timing", "config", "command", "env"):
        d.pop(key)
    return d


def test_two_processes_give_the_serial_numbers(tmp_path):
    cfg = _tiny()
    one = run(cfg.replace(workers=1), tmp_path / "one")
    two = run(cfg.replace(workers=2), tmp_path / "two")
    assert one.per_seed == two.per_seed and len(one.per_seed) == 2
    assert {"icl_M16", "icl_M64", "noctx_M16", "noctx_M64", "bayes_M16", "oracle_psi"} <= set(one.per_seed[0]["metrics"])
    assert one.per_seed[0]["metrics"] != one.per_seed[1]["metrics"]  # each seed draws its own world
    assert _numbers(tmp_path / "one") == _numbers(tmp_path / "two")  # every check, the grids, the curves


def test_workers_default_and_validation():
    assert Config().workers == 2 and Config.quick().workers == 1
    with pytest.raises(ValueError, match="workers"):
        Config(workers=0)
    # the control trains at the smallest and largest M only, the transformer at every M, in curve order
    assert _part3_arms(Config()) == [("icl", 64), ("noctx", 64), ("icl", 512), ("icl", 4096), ("noctx", 4096)]


def test_each_job_trains_its_arm_on_the_first_M_sequences(monkeypatch):
    import icml24.icl_theory.experiment as exp
    seen = []
    real = exp.train_icl

    def spy(**kw):
        seen.append((kw["context"], kw["Z"].shape[0], kw["seed"]))
        M = kw["Z"].shape[0]
        assert (kw["Z"] == train.Z[0, :M]).all() and (kw["Y"] == train.Y[0, :M]).all()  # nested: the first M
        assert (kw["Z_val"] == val.Z[0]).all() and kw["Z_val"].shape[0] == cfg.icl_val  # validation, not test
        return real(**kw)

    cfg = _tiny()
    _, _, train, val, _ = exp._part3_data(cfg, 1)
    monkeypatch.setattr(exp, "train_icl", spy)
    for name, M in _part3_arms(cfg):
        exp._part3_arm(cfg, 1, name, M)
    assert seen == [(name == "icl", M, 1) for name, M in _part3_arms(cfg)]
    assert train.Z.shape[1] == max(cfg.icl_M)


def test_seed_metrics_are_the_seeds_own_jobs(tmp_path):
    import icml24.icl_theory.experiment as exp
    cfg = _tiny()
    res = run(cfg, tmp_path)
    for i, seed in enumerate(cfg.seeds):
        ref = exp._part3_reference(cfg, seed)
        curve, _ = exp._part3_arm(cfg, seed, "noctx", 64)
        assert res.per_seed[i]["seed"] == seed
        assert res.per_seed[i]["metrics"]["noctx_M64"] == exp._curve_metrics(curve, ref["bayes_M64"])
        assert res.per_seed[i]["metrics"]["bayes_M16"] == {"nll": float(ref["bayes_M16"].mean())}
