"""Tuning and guards of next_gpt without the models: ``tune_on_validation`` with the stages and evaluations
replaced by known validation curves (grids extend past a winning edge, k stays >= 1), and the guards of every
sanity check on a recorder filled with made-up per-seed metrics."""

from __future__ import annotations

import math

import pytest

import icml24.next_gpt.experiment as E
from icml24.common.results import RunRecorder, verdict
from icml24.common.tuning import tune_grid
from icml24.next_gpt import world as W


class _Model:
    def __init__(self, arm: str) -> None:
        self.arm, self.lr = arm, None


CURVES = {  # validation score as a function of the stage-3 lr, per arm
    "signal": lambda lr: math.log10(lr),  # keeps rising: the top edge wins and the grid extends
    "pipeline": lambda lr: -(math.log10(lr) - math.log10(6e-3)) ** 2,  # optimum inside the declared grid
}


@pytest.fixture
def fake_stages(monkeypatch):
    trained = []

    def train_stage(m, stage, sampler, sc, seed, desc=""):
        assert stage == 3
        m.lr = sc.lr
        trained.append((m.arm, sc.lr))
        return {"nll": [1.0], "l2": [1.0]}

    def eval_generation(m, items, rng, cfg, seed):
        return CURVES[m.arm](m.lr), []

    def eval_selection(m, contexts, rng, prefixes=None):
        if prefixes is not None:  # the in-context baseline: more examples always help
            return len(prefixes[0]) / 100
        return CURVES[m.arm](m.lr)

    monkeypatch.setattr(E, "train_stage", train_stage)
    monkeypatch.setattr(E, "eval_generation", eval_generation)
    monkeypatch.setattr(E, "eval_selection", eval_selection)
    return trained


def _tune(grid_extra: int):
    cfg = E.Config(modalities=("image",), n_signal=(4,), n_eval=2, n_dialogues=2, grid_extra=grid_extra)
    specs = [W.spec("image")]
    return cfg, *E.tune_on_validation(cfg, specs, E.samplers(specs), 0, _Model("signal"), _Model("pipeline"))


def test_tune_on_validation_extends_a_winning_edge_and_keeps_every_trained_model(fake_stages):
    cfg, tunings, trained = _tune(2)
    sig, pipe, icl = tunings["signal"], tunings["pipeline"], tunings["stage2_icl"]
    # the signal curve keeps rising: two extensions by the grid's ratio (x3), still at the top: not tuned
    assert sig.extensions == pytest.approx([0.162, 0.486]) and sig.value == pytest.approx(0.486) and not sig.ok
    assert pipe.value == pytest.approx(6e-3) and pipe.extensions == [] and pipe.ok
    # k's top fills the context: a hard limit, never extended past (the plateau check judges it instead)
    assert icl.extensions == [] and icl.value == 4.0 and icl.ok and icl.at_limit
    assert set(trained) == ({("pipeline", lr) for lr in cfg.lr_grid}
                            | {("signal", lr) for lr in (*cfg.lr_grid, *sig.extensions)})
    assert ("signal", sig.value) in trained  # the picked extension's model is the one evaluated on test
    # signal lr at the edge, pipeline inside, k-curve 0.04 -> 0.02 from k = 2 to 4: a plateau (<= 0.05)
    assert [c.passed for c in E._tuning_checks(cfg, tunings)] == [False, True, True]
    # with no extension budget the same curves stop at the declared edges
    _, t0, _ = _tune(0)
    assert t0["signal"].extensions == [] and t0["signal"].value == pytest.approx(5.4e-2)
    assert t0["stage2_icl"].value == 4.0 and t0["stage2_icl"].extensions == []


def test_k_never_goes_below_one(fake_stages, monkeypatch):
    monkeypatch.setattr(E, "eval_selection", lambda m, c, rng, prefixes=None:
                        -len(prefixes[0]) if prefixes is not None else CURVES[m.arm](m.lr))
    _, tunings, _ = _tune(2)
    icl = tunings["stage2_icl"]
    assert icl.value == 1.0 and icl.extensions == [] and icl.at_limit  # k = 0 is the stage2 arm, not in reach


def recorder(tmp_path, cfg, *, icl: float = 0.6, stage1_selection: float | None = None):
    """A recorder with three seeds of synthetic per-arm metrics: in-context arms at ``icl`` (+ d/4, redraw + d/5),
    ``best_text`` the in-context arm, unless ``stage1_selection`` gives stage 1 a (better) selection score."""
    rec = RunRecorder(E.SLUG, cfg, tmp_path)
    for seed, d in enumerate((0.10, 0.20, 0.15)):
        stage1 = {"caption_acc": 0.97}
        if stage1_selection is not None:
            stage1["selection_acc"] = stage1_selection + d / 3
        rec.add_seed(seed, {
            "signal": {"implicit_acc": 0.6 + d, "selection_acc": 0.9 + d / 2},
            "pipeline": {"implicit_acc": 0.5, "selection_acc": 0.8},
            "untrained_proj": {"implicit_acc": 0.1 + d / 3}, "gold": {"implicit_acc": 0.95},
            "stage2_icl": {"selection_acc": icl + d / 4}, "stage2_icl_redraw": {"selection_acc": icl + d / 5},
            "best_text": {"selection_acc": stage1.get("selection_acc", icl + d / 4)},
            "stage1": stage1, "stage2": {"block_rate": 1.0, "l2_drop": 8.0 + seed}})
    return rec


def _tuned(ok: bool, grid=(1.0, 2.0, 3.0), arm: str = ""):
    if arm == "stage2_icl":  # ok: a flat k-curve (plateau); not ok: still rising from k_max / 2 to k_max
        return tune_grid(lambda vs: [[0.5 if ok else v] for v in vs], (1, 2), log=False, integer=True,
                         limits=(1, 2), max_extra=0)
    return tune_grid(lambda vs: [[v if not ok else -abs(v - 2.0)] for v in vs], grid, log=False, max_extra=0)


@pytest.mark.parametrize("failing, void", [
    ("pipeline", {E.CLAIM_IMPLICIT}), ("stage2_icl", {E.CLAIM_SELECTION}),
    ("signal", {E.CLAIM_IMPLICIT, E.CLAIM_SELECTION}), (None, set())])
def test_each_tuning_check_voids_exactly_the_claims_of_its_arm(tmp_path, failing, void):
    cfg = E.Config.quick()
    checks = E._checks(recorder(tmp_path, cfg), cfg, [1.0, 1.0, 1.0])
    checks += E._tuning_checks(cfg, {a: _tuned(a != failing, arm=a) for a in ("signal", "pipeline", "stage2_icl")})
    v = verdict(checks)
    assert {c.name for c in checks if c.kind == "claim" and c.void} == void and v["claims_void"] == len(void)
    if failing is None:
        assert v["label"] == "holds" and not v["sanity_failed"]
    assert all(c.detail.split(":")[0] in ("tuning", "the regime", "negative control")
               for c in checks if c.kind == "sanity")


def test_the_gold_decoding_check_guards_claim_1_and_the_global_ones_guard_both(tmp_path):
    cfg = E.Config.quick()
    rec = recorder(tmp_path, cfg)
    for row in rec.per_seed:
        row["metrics"]["gold"]["implicit_acc"] = 0.1  # the decoders cannot render the attributes
    tuned = {a: _tuned(True, arm=a) for a in ("signal", "pipeline", "stage2_icl")}
    checks = E._checks(rec, cfg, [1.0, 1.0, 1.0]) + E._tuning_checks(cfg, tuned)
    v = verdict(checks)
    assert {c.name for c in checks if c.void} == {E.CLAIM_IMPLICIT} and v["label"].startswith("holds 1/1, 1 void")
    checks = E._checks(recorder(tmp_path, cfg), cfg, [1.0, 0.0, 1.0]) + E._tuning_checks(cfg, tuned)
    assert verdict(checks)["label"] == "inconclusive (0/2 testable)"  # frozen parts changed: every claim void
