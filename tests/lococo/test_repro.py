"""Quick reproduction of lococo: run once, check the result's contents, the tuning, the config errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from icml24.common.results import ClaimCheck, verdict
from icml24.lococo.cache import make_compressors
from icml24.lococo.data import copied_half_mask, copy_loss, repeat_batch
from icml24.lococo.experiment import (
    H2O_BOUND_ARM,
    STRICT,
    Config,
    knob_grid,
    lococo_knobs,
    run,
    tune_baseline,
    tune_lococo,
    window_losses,
)
from icml24.lococo.model import tiny_llama
from tests.shared_checker import check_results_file


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("lococo_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    cfg = Config.quick()
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "lococo" and d["mode"] == "quick" and d["seeds"] == list(cfg.seeds)
    assert {"full", "best_baseline", "lococo", "lococo_lambda0", "lococo_untrained", "streaming", "h2o",
            "tova"} <= set(d["summary"])
    for name in ("loss_vs_budget.png", "passkey_vs_distance.png", "compressor_training.png"):
        assert (out / name).stat().st_size > 1000
    kinds = [c.kind for c in res.claim_checks]
    assert kinds.count("claim") == len(cfg.budgets) and "sanity" in kinds and "mechanism" in kinds
    assert all(c.metric == f"copy_M{c.name[2:4]}" for c in res.checks("claim"))  # the copied-half loss
    assert all(c.ci_low is not None for c in res.claim_checks if c.kind == "claim")
    ss = res.extra["single_shot"]  # kvpress presses + ours through one DynamicCache path, in a subprocess
    assert "error" not in ss
    if "skipped" not in ss:
        for M in cfg.budgets:
            assert all(isinstance(ss[str(M)][p], float) for p in ("StreamingLLMPress", "SnapKVPress", "TOVAPress"))
            assert len(ss[str(M)]["lococo"]) == len(cfg.seeds)


def test_quick_run_tunes_every_baseline_on_validation_and_bounds_losses(quick):
    res, _ = quick
    cfg = Config.quick()
    for M in cfg.budgets:
        pb = res.extra["per_budget"][str(M)]
        tun = res.extra["tuning"][f"M={M}"]
        for pol in ("streaming", "h2o", "tova"):
            evaluated = [t["knobs"] for t in pb["tuning"][pol]]
            assert all(kn in evaluated for kn in knob_grid(cfg, pol, M))  # the declared grid, plus extensions
            assert len({json.dumps(kn, sort_keys=True) for kn in evaluated}) == len(evaluated)  # each once
            assert pb["tuned"][pol] in evaluated and tun[pol]["picked_knobs"] == pb["tuned"][pol]
            # per-row validation losses, one-SE rule: the pick is within noise of the validation best
            best = min(t["val_loss"] for t in pb["tuning"][pol])
            assert next(t["val_loss"] for t in pb["tuning"][pol] if t["knobs"] == pb["tuned"][pol]) <= best + 0.1
        sinks = tun["streaming"]["n_sink"]
        assert sinks["declared"] == [float(s) for s in cfg.sink_grid if s < M]
        assert len(sinks["extensions"]) <= cfg.grid_extra and all(0 <= v <= M for v in sinks["grid"])
        for cell in ("recent_fraction (accumulate_scores=False)", "recent_fraction (accumulate_scores=True)"):
            t = tun["h2o"][cell]
            assert t["declared"] == list(cfg.recent_grid) and all(0.0 <= f <= 1.0 for f in t["grid"])
            assert len(t["extensions"]) <= cfg.grid_extra
        lt = tun["lococo"]  # LoCoCo's own knobs: the same tune_grid budget, on the same validation rows
        assert lt["r"]["declared"] == list(cfg.hh_keep_grid) and lt["local_fraction"]["declared"] == list(cfg.local_grid)
        assert all(len(lt[k]["extensions"]) <= cfg.grid_extra for k in ("r", "local_fraction"))
        assert pb["lococo_knobs"] == lt["picked_knobs"] == lococo_knobs(cfg, M, lt["r"]["picked"],
                                                                         lt["local_fraction"]["picked"])
        for tl, full in ((pb["copy_loss"], res.extra["full_test"]["copy"]),
                         (pb["text_loss"], res.extra["full_test"]["text"])):
            # nothing beats the full cache by more than noise; losses are finite nats/byte
            assert all(0.0 < v < 6.0 for v in tl.values())
            assert min(tl.values()) >= full - 0.05


def test_quick_run_writes_schema3_that_the_shared_checker_accepts(quick):
    _, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["schema_version"] == 3 and "claims_void" in d["verdict"]
    check_results_file(out / "results.json")


def test_per_budget_sanity_checks_guard_only_their_budgets_claim(quick):
    res, _ = quick
    cfg = Config.quick()
    claims = {M: next(c for c in res.checks("claim") if c.name.startswith(f"M={M}:")) for M in cfg.budgets}
    for c in res.checks("sanity"):
        assert c.detail.startswith(("the regime:", "negative control:", "tuning:", "training:")), c.name
        M = next((M for M in cfg.budgets if c.name.startswith(f"M={M}:")), None)
        assert c.guards == ([] if M is None else [claims[M].name]), c.name  # the across-M trend guards all
        assert M is not None, c.name  # every guard is per budget (issue 28)
    tuning = [c for c in res.checks("sanity") if "tuning:" in c.name]
    assert len(tuning) == 4 * len(cfg.budgets)  # StreamingLLM, H2O, LoCoCo's r and local_len
    regime = [c for c in res.checks("sanity") if c.detail.startswith(("the regime:", "training:"))]
    assert len(regime) == 3 * len(cfg.budgets)  # full solves, StreamingLLM fails, trained beats untrained
    failed = [s for s in res.checks("sanity") if not s.passed]
    for c in res.checks("claim"):
        assert c.void_by == sorted(s.name for s in failed if not s.guards or c.name in s.guards)

    def sanity(c, ok):
        return ClaimCheck(name=c.name, metric=c.metric, measured=float(ok), threshold=1.0, direction=">=",
                          kind="sanity", guards=c.guards)
    lo, hi = cfg.budgets
    for M, void in ((lo, [True, False]), (hi, [False, True])):  # one budget's failed regime check voids its claim
        checks = [*res.checks("claim"), *(sanity(c, not (c.name.startswith(f"M={M}:") and c.detail.startswith("the regime:")))
                                          for c in res.checks("sanity"))]
        v = verdict(checks)
        assert [bool(c.void_by) for c in checks[:2]] == void and v["claims_void"] == 1
        assert v["claims_total"] == 1


def test_tune_baseline_extends_integer_and_fraction_grids_within_their_limits():
    cfg = dataclasses.replace(Config.quick(), sink_grid=(0, 4, 8), recent_grid=(0.0, 0.25, 0.5), grid_extra=2)
    M = 32
    # more sinks always better: n_sink extends by its step (4) twice, stays an integer, and stops there
    tb = tune_baseline(cfg, "streaming", M, lambda kn: 2.0 - 0.01 * kn["n_sink"])
    t = tb["tuned"]["n_sink"]
    assert t.extensions == [12.0, 16.0] and tb["knobs"] == {"n_sink": 16} and not t.ok
    # fewer sinks always better: 0 is the domain's hard limit: no extension, and a legitimate pick
    t = tune_baseline(cfg, "streaming", M, lambda kn: 2.0 + 0.01 * kn["n_sink"])["tuned"]["n_sink"]
    assert t.extensions == [] and t.value == 0.0 and t.at_limit and t.ok
    # H2O: a longer recent window always better: the fraction extends to 0.75 and 1.0 (its hard limit)
    tb = tune_baseline(cfg, "h2o", M, lambda kn: 2.0 - 0.01 * kn["recent"] - 0.001 * kn["accumulate_scores"])
    cells = list(tb["tuned"].values())
    assert all(c.extensions == [0.75, 1.0] for c in cells) and tb["knobs"] == {"recent": 32, "accumulate_scores": True}
    # no recent window best: with last-chunk scores that is the natural bound (H2O = LoCoCo λ = 0), accumulated not
    tb = tune_baseline(cfg, "h2o", M, lambda kn: 2.0 + 0.01 * kn["recent"] + 0.001 * kn["accumulate_scores"])
    last, acc = tb["tuned"].values()
    assert last.value == acc.value == 0.0 and last.at_natural_bound and last.ok and last.reduces_to == H2O_BOUND_ARM
    assert acc.at_limit and not acc.at_natural_bound and tb["knobs"] == {"recent": 0, "accumulate_scores": False}
    undeclared = tune_baseline(dataclasses.replace(cfg, h2o_natural_bound=False), "h2o", M,
                               lambda kn: 2.0 + 0.01 * kn["recent"])["tuned"]["recent_fraction (accumulate_scores=False)"]
    assert undeclared.at_limit and not undeclared.at_natural_bound and undeclared.reduces_to is None
    # each setting is evaluated once; TOVA is a two-way switch
    seen = []
    tb = tune_baseline(cfg, "tova", M, lambda kn: seen.append(kn) or (1.0 if kn["tova_per_head"] else 2.0))
    assert tb["knobs"] == {"tova_per_head": True} and tb["tuned"] == {} and len(seen) == 2


def test_h2o_at_its_natural_bound_equals_the_lococo_lambda0_arm():
    """The experiment's own arms: H2O with recent fraction 0 and last-chunk scores (the natural bound declared in the
    Config) gives the same validation losses as LoCoCo with λ = 0 and ℓ = 0 built as in ``run``; accumulated scores
    do not (so the test can tell them apart)."""
    cfg = Config.quick()
    torch.manual_seed(0)
    model = tiny_llama(hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, num_heads=cfg.num_heads,
                       intermediate_size=cfg.intermediate_size, seed=0)
    ids = torch.randint(0, 256, (3, cfg.context), generator=torch.Generator().manual_seed(1))
    for M in cfg.budgets:
        sel = make_compressors(num_layers=cfg.num_layers, head_dim=cfg.hidden_size // cfg.num_heads, budget=M,
                               chunk_size=cfg.chunk, kernel_size=cfg.kernel_size, hh_keep_rate=0.5,
                               lambda_init=0.0, learn_lambda=False, seed=0)
        lam0 = window_losses(model, ids, chunk=cfg.chunk, cache_kwargs={"policy": "lococo", "budget": M,
                                                                         "compressors": sel})
        got = {}
        tune_baseline(cfg, "h2o", M, lambda kn, M=M, got=got: got.setdefault(
            kn["accumulate_scores"], window_losses(model, ids, chunk=cfg.chunk, cache_kwargs={
                "policy": "h2o", "budget": M, **kn})).mean() if kn["recent"] == 0 else 9.0)
        np.testing.assert_allclose(got[False], lam0, rtol=0, atol=1e-5)
        assert np.abs(got[True] - lam0).max() > 1e-3


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="budgets"):
        Config(budgets=(64, 32))
    with pytest.raises(ValueError, match="passkey_distances"):
        Config(passkey_distances=(50,))
    with pytest.raises(ValueError, match="chunk"):
        Config(chunk=0)
    with pytest.raises(ValueError, match="sink_grid"):
        Config(sink_grid=(4,))
    with pytest.raises(ValueError, match="recent_grid"):
        Config(recent_grid=(0.5,))
    with pytest.raises(ValueError, match="h2o_natural_bound"):
        Config(recent_grid=(0.25, 0.5))
    with pytest.raises(ValueError, match="grid_extra"):
        Config(grid_extra=-1)
    with pytest.raises(ValueError, match="copy_skip"):
        Config(copy_skip=32)
    with pytest.raises(ValueError, match="copy_skip"):
        Config(copy_skip=128)
    with pytest.raises(ValueError, match="copy offset"):
        Config(context=160, passkey_distances=(100,), copy_skip=64)
    with pytest.raises(ValueError, match="repeat_fraction"):
        Config(repeat_fraction=0.8, passkey_fraction=0.3)
    with pytest.raises(ValueError, match="hh_keep_grid"):
        Config(hh_keep_grid=(0.5,))
    with pytest.raises(ValueError, match="full_copy_max"):
        Config(full_copy_max=4.0)


@pytest.mark.parametrize(("T", "P", "S"), [(256, 0, 64), (255, 0, 64), (256, 64, 1), (255, 64, 1), (9, 0, 1),
                                            (10, 3, 2)])
def test_copied_half_mask_selects_exactly_the_scored_copies(T, P, S):
    """NLL position i predicts token i + 1; the copied half is the targets t in [P + L + S, T) (L = ceil((T − P)/2)):
    each equals the token L back and so does its predecessor; the first copy (t = P + L), the first S − 1 after it
    and everything before are out, whatever the parity of T − P."""
    L = (T - P + 1) // 2
    x = repeat_batch(n=3, length=T, generator=torch.Generator().manual_seed(T + P), prefix=P)
    assert x.shape == (3, T) and bool((x[:, P + L:] == x[:, P:T - L]).all())
    assert bool((x[:, :P] == 32).all()) and bool(((x[:, P:] >= 32) & (x[:, P:] < 127)).all())  # spaces, printable
    mask = copied_half_mask(T, prefix=P, skip=S)
    assert mask.shape == (T - 1,) and int(mask.sum()) == T - P - L - S
    idx = torch.arange(T - 1)
    assert bool((mask == (idx + 1 >= P + L + S)).all())
    i = idx[mask]
    assert bool((x[:, i + 1] == x[:, i + 1 - L]).all()) and bool((x[:, i] == x[:, i - L]).all())
    assert int((i + 1 - L).min()) == P + S  # the earliest scored source
    # per-row mean over exactly those positions
    nll = torch.arange(T - 1, dtype=torch.float64).repeat(2, 1) + torch.tensor([[0.0], [10.0]], dtype=torch.float64)
    lo = P + L + S - 1
    want = torch.tensor([(lo + T - 2) / 2, (lo + T - 2) / 2 + 10.0], dtype=torch.float64)
    torch.testing.assert_close(copy_loss(nll, prefix=P, skip=S), want)


def test_no_sink_holds_a_scored_source_and_every_source_is_beyond_the_cache():
    """The Config's copied half: every scored target's source is outside the first max(M) tokens (StreamingLLM's
    sinks) and L >= M + B bytes back."""
    cfg = Config()
    mask = copied_half_mask(cfg.context, skip=cfg.copy_skip)
    sources = torch.arange(cfg.context - 1)[mask] + 1 - cfg.copy_offset
    assert int(sources.min()) == cfg.copy_skip >= max(cfg.budgets)
    assert cfg.copy_offset == cfg.context // 2 >= max(cfg.budgets) + cfg.chunk


def test_trained_vs_untrained_guard_is_the_paired_copy_gap_and_guards_its_budget(quick):
    res, out = quick
    cfg = Config.quick()
    d = json.loads((out / "results.json").read_text())
    for M in cfg.budgets:
        g = next(c for c in res.checks("sanity") if c.name.startswith(f"M={M}: the trained compressor beats"))
        claim = next(c for c in res.checks("claim") if c.name.startswith(f"M={M}:"))
        diffs = [p["metrics"]["lococo"][f"copy_M{M}"] - p["metrics"]["lococo_untrained"][f"copy_M{M}"]
                 for p in d["per_seed"]]
        assert g.measured == pytest.approx(float(np.mean(diffs)), abs=1e-12) and g.n == len(cfg.seeds)
        assert g.direction == "<=" and g.threshold == -STRICT and g.passed == (g.ci_high <= -STRICT)
        void_by = next(c["void_by"] for c in d["claim_checks"] if c["name"] == claim.name)
        assert g.guards == [claim.name] and (g.passed or g.name in void_by)
        assert all(dd != 0.0 for dd in diffs)  # the control is a separate, untrained copy of the same init
        lam = res.extra["per_budget"][str(M)]["lambda_trained"]
        assert all(abs(v - cfg.lambda_init) > 0 for s in lam.values() for v in s)  # training moved λ


def test_regime_guards_read_the_full_cache_and_tuned_streaming_copy_losses(quick):
    res, out = quick
    cfg = Config.quick()
    d = json.loads((out / "results.json").read_text())
    for M in cfg.budgets:
        full = next(c for c in res.checks("sanity") if c.name.startswith(f"M={M}: the full cache solves"))
        ev = next(c for c in res.checks("sanity") if c.name.startswith(f"M={M}: eviction fails"))
        m = d["per_seed"][0]["metrics"]
        assert full.measured == pytest.approx(m["full"][f"copy_M{M}"]) and full.threshold == cfg.full_copy_max
        assert ev.measured == pytest.approx(m["streaming"][f"copy_M{M}"]) and ev.threshold == cfg.streaming_copy_min
        assert full.passed == (full.measured <= cfg.full_copy_max) and ev.passed == (ev.measured >= 3.0)


def test_tune_lococo_tunes_r_then_local_len_with_the_baselines_budget():
    cfg = dataclasses.replace(Config.quick(), hh_keep_grid=(0.25, 0.5, 0.75), local_grid=(0.0, 0.25, 0.5),
                              grid_extra=2)
    M = 32
    seen = []

    def val(kn):  # more heavy hitters always better, local window best at 0.25 of m_hh; 4 rows with noise 1e-4
        seen.append(kn)
        m_hh = M - int(M * (1 - kn["hh_keep_rate"]))
        base = 2.0 - kn["hh_keep_rate"] + abs(kn["local_len"] / m_hh - 0.25)
        return [base + 1e-4 * k for k in range(4)]

    t = tune_lococo(cfg, M, val)
    assert t["tuned"]["r"].extensions == [1.0] and t["r"] == 1.0  # extended to r's hard limit, a legitimate pick
    assert t["tuned"]["r"].ok and t["local_fraction"] == 0.25 and t["tuned"]["local_fraction"].ok
    assert t["knobs"] == lococo_knobs(cfg, M, 1.0, 0.25) == {"hh_keep_rate": 1.0, "local_len": 8}
    assert len(seen) == len({tuple(sorted(k.items())) for k in seen}) == len(t["evaluated"])  # each trained once
    assert {"hh_keep_rate": 1.0, "local_len": 0} in seen and len(seen) == 6  # 3 + 1 extension, then 2 new ℓ


def test_identical_arms_never_beat_each_other():
    """A zero-width interval at 0 (trained = untrained, e.g. r = 1 leaves no fused slot) fails every "beats" check."""
    from icml24.common.results import paired_check

    c = paired_check(name="g", metric="m", method=[4.5] * 5, baseline=[4.5] * 5, direction="<=", threshold=-STRICT,
                     kind="sanity")
    assert not c.passed and c.ci_high == 0.0
    assert paired_check(name="g", metric="m", method=[4.4, 4.41, 4.39, 4.4, 4.4], baseline=[4.5] * 5,
                        direction="<=", threshold=-STRICT, kind="sanity").passed
