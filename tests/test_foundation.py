"""The package foundation: registry, CLI, config overrides, results schema, stats."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from icml24 import cli, registry
from icml24.common.config import ExperimentConfig
from icml24.common.results import (
    ClaimCheck,
    RunRecorder,
    RunResult,
    compare_arms,
    is_quick,
    one_sample_check,
    paired_check,
    verdict,
)
from icml24.common.stats import (
    cluster_bootstrap_ci,
    mean_std,
    one_sample_ci,
    paired_ci,
    paired_difference,
    summarize,
)
from icml24.report import render_results_md

SRC = Path(registry.__file__).parent
SLUGS = ["loraplus", "exp_sgdm", "mola", "kd_ranking", "gcdro", "private_density", "dp_public", "fed_auc",
         "spikezip_tf", "iffn", "lococo", "traveling_waves", "alh", "tat", "bayes_mcts", "simpro", "dplm",
         "next_gpt", "icl_theory"]


def test_registry_has_the_19_papers_and_matches_the_folders():
    assert list(registry.PAPERS) == SLUGS
    folders = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()} - {"common"}
    assert folders <= set(SLUGS), f"paper folders not in the registry: {folders - set(SLUGS)}"
    for slug in SLUGS:
        assert registry.PAPERS[slug].implemented == (SRC / slug / "experiment.py").exists()


@pytest.mark.parametrize("slug", [s for s in SLUGS if (SRC / s / "experiment.py").exists()])
def test_implemented_papers_follow_the_contract(slug):
    mod = registry.experiment(slug)
    full, quick = mod.Config(), mod.Config.quick()
    assert isinstance(full, ExperimentConfig) and is_quick(quick) and not is_quick(full)
    for f in type(full).__dataclass_fields__.values():
        assert f.metadata.get("help"), f"{slug}.Config.{f.name} has no help"
    assert callable(mod.run)
    assert (SRC / slug / "README.md").exists()


def test_list_shows_all_papers(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(s in out for s in SLUGS) and "19 papers" in out


def test_show(capsys):
    assert cli.main(["show", "loraplus"]) == 0
    assert "2402.12354" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["run", "nope"], "unknown paper 'nope'; valid: all, loraplus"),
    (["show", "nope"], "unknown paper 'nope'"),
    (["run", "loraplus", "--quick", "--set", "bogus=1"], "unknown config key 'bogus'; valid keys:"),
    (["run", "loraplus", "--quick", "--set", "steps=abc"], "cannot set steps='abc'"),
    (["run", "loraplus", "--quick", "--set", "steps"], "--set expects KEY=VALUE"),
    (["run", "loraplus", "--quick", "--set", "steps=0"], "steps must be an int >= 1"),
    (["run", "loraplus", "--quick", "--out", "results"], "quick runs never write into results/"),
    (["frobnicate"], "invalid choice"),
    (["run", "loraplus", "--quick", "--device", "tpu"], "device must be cpu, cuda[:N] or mps"),
])
def test_cli_errors_are_one_line_with_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(cli.main(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error(capsys):
    assert cli.main(["run", "loraplus", "--quick", "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_run_of_a_planned_paper_is_refused(capsys):
    planned = [s for s in SLUGS if not registry.PAPERS[s].implemented]
    if not planned:
        pytest.skip("every paper is implemented")
    assert cli.main(["run", planned[0]]) == 2
    assert "planned" in capsys.readouterr().err


@dataclass(frozen=True)
class _Cfg(ExperimentConfig):
    lr: float = field(default=0.1, metadata={"help": "lr"})
    widths: tuple[int, ...] = field(default=(8, 16), metadata={"help": "widths"})
    flag: bool = field(default=False, metadata={"help": "flag"})
    name: str | None = field(default=None, metadata={"help": "name"})

    @classmethod
    def quick(cls):
        return cls(seeds=(0,), widths=(8,))


def test_set_overrides_convert_by_field_type():
    c = _Cfg().with_overrides({"lr": "0.5", "widths": "4,5,6", "flag": "true", "name": "none", "seeds": "3,4"})
    assert (c.lr, c.widths, c.flag, c.name, c.seeds) == (0.5, (4, 5, 6), True, None, (3, 4))
    with pytest.raises(KeyError, match="valid keys"):
        _Cfg().with_overrides({"nope": "1"})
    with pytest.raises(ValueError, match="cannot set flag"):
        _Cfg().with_overrides({"flag": "maybe"})
    with pytest.raises(ValueError, match="seeds must be distinct"):
        _Cfg(seeds=(1, 1))


def _check(kind, passed, **kw):
    ci = {"ci_low": 0.1, "ci_high": 0.3} if kind == "claim" else {}
    return ClaimCheck(name=f"{kind}{passed}", metric="m", measured=0.2, threshold=0.0 if passed else 0.5,
                      direction=">=", kind=kind, **ci, **kw)


def test_claim_check_computes_its_verdict():
    kw = {"name": "a", "metric": "m", "kind": "mechanism"}
    assert ClaimCheck(measured=0.5, threshold=0.9, direction="<=", **kw).passed
    assert not ClaimCheck(measured=0.95, threshold=0.9, direction="<=", **kw).passed
    assert not ClaimCheck(measured=float("nan"), threshold=0.9, direction=">=", **kw).passed
    with pytest.raises(TypeError):
        ClaimCheck(measured=1, threshold=0, direction=">=", passed=False, **kw)
    with pytest.raises(ValueError, match="kind must be one of"):
        ClaimCheck(name="a", metric="m", measured=1, threshold=0, direction=">=", kind="vibe")
    with pytest.raises(ValueError, match="needs a confidence interval"):
        ClaimCheck(name="a", metric="m", measured=1, threshold=0, direction=">=", kind="claim")
    claim = {"name": "c", "metric": "m", "kind": "claim", "measured": 1.0}
    # the interval, not the mean, must clear the threshold
    assert not ClaimCheck(threshold=0.5, direction=">=", ci_low=0.4, ci_high=1.6, **claim).passed
    assert ClaimCheck(threshold=0.3, direction=">=", ci_low=0.4, ci_high=1.6, **claim).passed
    assert not ClaimCheck(threshold=1.5, direction="<=", ci_low=0.4, ci_high=1.6, **claim).passed
    assert ClaimCheck(threshold=1.0, direction="==", margin=0.7, ci_low=0.4, ci_high=1.6, **claim).passed
    assert not ClaimCheck(threshold=1.0, direction="==", margin=0.5, ci_low=0.4, ci_high=1.6, **claim).passed
    assert not ClaimCheck(threshold=0.0, direction=">=", ci_low=float("nan"), ci_high=1.0, **claim).passed


def test_paired_ci_matches_scipy_on_a_worked_example():
    from scipy import stats as st

    method, baseline = [0.81, 0.78, 0.84, 0.80, 0.83], [0.79, 0.77, 0.80, 0.80, 0.80]
    d = np.subtract(method, baseline)
    lo, hi = st.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=st.sem(d))
    out = paired_ci(method, baseline)
    assert out["mean"] == pytest.approx(0.02) and out["n"] == 5
    assert (out["ci_low"], out["ci_high"]) == (pytest.approx(lo), pytest.approx(hi))
    assert out["p_value"] == pytest.approx(st.ttest_rel(method, baseline).pvalue)
    # worked by hand: mean 0.02, sd 0.01581, t_{0.975,4} = 2.7764 -> half-width 0.01963
    assert out["ci_low"] == pytest.approx(0.02 - 0.019633, abs=1e-5)
    lr = paired_ci([2.0, 4.0, 8.0], [1.0, 2.0, 4.0], log_ratio=True)
    assert lr["mean"] == lr["ci_low"] == lr["ci_high"] == pytest.approx(np.log(2))
    with pytest.raises(ValueError, match="aligned"):
        paired_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match=">= 10 units"):
        paired_ci([1.0, 2.0, 3.0], [0.0, 0.5, 0.1], bootstrap=True)
    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 1.0, 40), rng.normal(0.0, 1.0, 40)
    boot = paired_ci(a, b, bootstrap=True)
    t = paired_ci(a, b)
    assert boot["ci_low"] < boot["mean"] < boot["ci_high"]
    assert boot["ci_low"] == pytest.approx(t["ci_low"], abs=0.15)
    one = one_sample_ci([1.0, 2.0, 3.0])
    assert (one["ci_low"], one["ci_high"]) == pytest.approx(st.t.interval(0.95, 2, loc=2.0, scale=st.sem([1, 2, 3])))


def test_cluster_bootstrap_resamples_clusters_then_units():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(5), 60)
    noise = rng.normal(0, 1, 300)
    # one cluster per unit: the two-stage bootstrap is the plain bootstrap (same width up to resampling noise)
    lo1, hi1 = cluster_bootstrap_ci(noise, np.arange(300))
    boot = paired_ci(noise, np.zeros(300), bootstrap=True)
    assert abs((hi1 - lo1) - (boot["ci_high"] - boot["ci_low"])) < 0.05
    # identical clusters: only the within-cluster resampling remains (no wider than the plain bootstrap)
    same = np.tile(noise[:60], 5)
    lo2, hi2 = cluster_bootstrap_ci(same, labels)
    assert lo2 < same.mean() < hi2 and hi2 - lo2 < 1.2 * (hi1 - lo1)
    # clusters that differ: the interval covers the spread of the cluster means, far wider than units alone
    shifted = noise + np.repeat([-3.0, -1.0, 0.0, 1.0, 3.0], 60)
    lo3, hi3 = cluster_bootstrap_ci(shifted, labels)
    assert hi3 - lo3 > 5 * (hi1 - lo1) and lo3 < shifted.mean() < hi3
    assert cluster_bootstrap_ci(shifted, labels, seed=3) != (lo3, hi3)
    assert cluster_bootstrap_ci(shifted, labels) == (lo3, hi3)  # seeded
    st = paired_ci(shifted, np.zeros(300), clusters=labels)
    assert (st["ci_low"], st["ci_high"]) == (lo3, hi3)
    with pytest.raises(ValueError, match=">= 2 clusters"):
        cluster_bootstrap_ci(noise, np.zeros(300))
    with pytest.raises(ValueError, match="cluster labels"):
        cluster_bootstrap_ci(noise, labels[:10])


def test_paired_check_clears_the_threshold_with_its_interval():
    c = paired_check(name="better", metric="acc", method=[1.0, 2.0, 3.5], baseline=[0.0, 1.0, 2.0],
                     direction=">=", threshold=0.5, method_arm="m", baseline_arm="b")
    assert c.kind == "claim" and c.n == 3 and c.measured == pytest.approx(7 / 6)
    assert c.ci_low < 0.5 < c.measured and not c.passed  # mean clears it, the interval does not
    c2 = paired_check(name="better", metric="acc", method=[1.0, 2.0, 3.1], baseline=[0.0, 1.0, 2.0],
                      direction=">=", threshold=0.5)
    assert c2.passed
    assert not one_sample_check(name="s", metric="slope", values=[0.1, -0.2, 0.3], direction=">=",
                                threshold=0.0).passed


@pytest.mark.parametrize("claims", [(), (True,), (False,), (True, True), (True, False), (False, False)])
@pytest.mark.parametrize("mechanisms", [(), (True,), (False,), (True, False)])
@pytest.mark.parametrize("sanity", [(), (True,), (False,), (True, False)])
@pytest.mark.parametrize("schema", [2, 3])
def test_verdict_label_follows_from_the_checks(claims, mechanisms, sanity, schema):
    checks = ([_check("claim", p) for p in claims] + [_check("mechanism", p) for p in mechanisms]
              + [_check("sanity", p) for p in sanity])
    v = verdict(checks, schema=schema)
    held = sum(claims)
    voided = schema == 3 and False in sanity  # an unscoped guard voids every claim
    if schema == 2 and False in sanity:
        want = "inconclusive"
    elif not claims:
        want = f"no claim (mechanisms {sum(mechanisms)}/{len(mechanisms)})"
    elif held == len(claims):
        want = "holds"
    elif held == 0:
        want = "does not hold"
    else:
        want = "partly holds"
    if voided and claims:
        want = f"inconclusive (0/{len(claims)} testable)"
    assert v["label"] == want
    assert (v["claims_held"], v["claims_total"]) == ((0, 0) if voided else (held, len(claims)))
    assert v.get("claims_void", 0) == (len(claims) if voided else 0)
    assert (v["mechanisms_held"], v["mechanisms_total"]) == (sum(mechanisms), len(mechanisms))
    assert v["sanity_failed"] == [c.name for c in checks if c.kind == "sanity" and not c.passed]


def test_a_failing_sanity_check_is_inconclusive_and_mechanisms_never_change_the_label():
    assert verdict([_check("claim", True), _check("sanity", False)])["label"] == "inconclusive (0/1 testable)"
    for mech in ([], [_check("mechanism", False)], [_check("mechanism", True)]):
        assert verdict([_check("claim", True), *mech])["label"] == "holds"
        assert verdict([_check("claim", False), *mech])["label"] == "does not hold"


def test_results_schema_round_trip_and_report(tmp_path):
    cfg = _Cfg.quick().replace(seeds=(5, 6, 7))
    rec = RunRecorder("loraplus", cfg, tmp_path)
    for s in cfg.seeds:
        rec.add_seed(s, {"lora": {"loss": 1.0 + s - 5}, "loraplus": {"loss": 0.5 + s - 5}})
    check = rec.paired(name="lower loss", metric="loss", method_arm="loraplus", baseline_arm="lora",
                       direction="<=", threshold=0.0)
    mech = compare_arms(rec.summary(), name="ratio", metric="loss", baseline_arm="lora", method_arm="loraplus",
                        direction="<=", margin=0.9, kind="ratio", check_kind="mechanism")
    res = rec.finish([check, mech])
    data = json.loads((tmp_path / "results.json").read_text())
    for key in ["schema_version", "slug", "paper", "claim", "mode", "config", "seeds", "per_seed", "summary",
                "claim_checks", "verdict", "env", "timing"]:
        assert key in data
    assert set(data["env"]) == {"python", "torch", "numpy", "platform", "threads", "device", "git_sha"}
    assert data["summary"]["lora"]["loss"]["mean"] == pytest.approx(2.0)
    assert data["schema_version"] == 3 and data["verdict"]["label"] == "holds"
    c0 = data["claim_checks"][0]
    assert c0["kind"] == "claim" and c0["n"] == 3 and c0["ci_low"] <= c0["measured"] <= c0["ci_high"] and c0["passed"]
    assert data["claim_checks"][1]["measured"] == pytest.approx(1.5 / 2.0) and data["claim_checks"][1]["passed"]
    assert RunResult.load(tmp_path / "results.json").to_dict() == res.to_dict()
    assert data["mode"] == "quick" and data["command"] == "icml24 run loraplus --quick --seeds 5 6 7"
    report = (tmp_path / "report.md").read_text()
    assert "| metric | baseline mean ± std | method mean ± std | measured [95% CI] |" in report
    assert "**Verdict: holds**" in report and "## Mechanisms" in report and "icml24 run loraplus" in report
    (tmp_path / "loraplus").mkdir()
    (tmp_path / "results.json").rename(tmp_path / "loraplus" / "results.json")
    md = render_results_md(tmp_path)
    assert "| [loraplus](results/loraplus/report.md) | 3 | **holds** | 1/1 | 0 | 1/1 |" in md
    old = dict(data, schema_version=1)
    (tmp_path / "mola").mkdir()
    (tmp_path / "mola" / "results.json").write_text(json.dumps(old))
    assert "| [mola](results/mola/report.md) | 1 | schema 1, not yet re-run under the verdict rules" in \
        render_results_md(tmp_path)


def test_stats():
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(2**0.5))
    s = summarize([1.0, 2.0, 3.0])
    assert s["ci_low"] < 2.0 < s["ci_high"] and s["n"] == 3
    d = paired_difference([2.0, 3.0, 5.0], [1.0, 1.0, 2.0])
    assert d["mean"] == pytest.approx(2.0)


class _FakeExperiment:
    """Stands in for an experiment module: ``Config`` and a ``run`` whose claim holds iff ``lr < 1``."""

    Config = _Cfg

    @staticmethod
    def run(cfg, out_dir):
        if cfg.flag:
            raise RuntimeError("boom")
        rec = RunRecorder("loraplus", cfg, out_dir)
        for s in cfg.seeds:
            rec.add_seed(s, {"base": {"loss": 1.0 + 0.01 * s}, "method": {"loss": cfg.lr + 0.02 * s}})
        return rec.finish([rec.paired(name="c", metric="loss", method_arm="method", baseline_arm="base",
                                      direction="<=", threshold=0.0)])


@pytest.fixture
def fake_registry(monkeypatch):
    monkeypatch.setattr(registry, "experiment", lambda slug: _FakeExperiment)
    monkeypatch.setattr(registry.Paper, "implemented", property(lambda self: self.slug in ("loraplus", "mola")))


def test_cli_run_applies_seeds_and_sets_and_summarises(fake_registry, tmp_path, capsys):
    code = cli.main(["run", "loraplus", "--quick", "--out", str(tmp_path), "--seeds", "3", "4", "--set", "lr=0.5",
                     "--quiet"])
    assert code == 0
    data = json.loads((tmp_path / "loraplus" / "results.json").read_text())
    assert data["seeds"] == [3, 4] and data["config"]["lr"] == 0.5 and data["claim_checks"][0]["passed"]
    assert "| loraplus | holds — claims 1/1, mechanisms 0/0, sanity all pass |" in capsys.readouterr().out


def test_cli_strict_fails_on_a_claim_that_does_not_hold(fake_registry, tmp_path):
    args = ["run", "loraplus", "--quick", "--out", str(tmp_path), "--set", "lr=2.0", "--quiet"]
    assert cli.main(args) == 0
    assert cli.main([*args, "--strict"]) == 1


def test_cli_run_all_keeps_going_after_a_crash(fake_registry, tmp_path, capsys, monkeypatch):
    calls, original = [], _FakeExperiment.run

    def run(cfg, out_dir):
        calls.append(out_dir.name)
        if out_dir.name == "loraplus":
            raise RuntimeError("boom")
        return original(cfg, out_dir)

    monkeypatch.setattr(_FakeExperiment, "run", staticmethod(run))
    assert cli.main(["run", "all", "--quick", "--out", str(tmp_path), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert calls == ["loraplus", "mola"]
    assert "| loraplus | CRASHED: RuntimeError: boom |" in out and "| mola | does not hold — claims 0/1" in out  # one seed: no interval
