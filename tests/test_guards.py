"""Schema 3: sanity checks guard named claims, void claims do not vote, and schema-2 files still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from icml24.common.results import (
    ClaimCheck,
    RunResult,
    one_sample_check,
    paired_check,
    render_report,
    verdict,
)
from icml24.report import render_results_md
from tests.shared_checker import check_results_file

ROOT = Path(__file__).resolve().parents[1]


def _claim(name: str, holds: bool, **kw) -> ClaimCheck:
    base = [1.0, 1.1, 0.9, 1.0]
    return paired_check(name=name, metric="acc", method=[b + (0.5 if holds else -0.5) for b in base],
                        baseline=base, direction=">=", method_arm="m", baseline_arm="b", **kw)


def _sanity(name: str, ok: bool, guards=()) -> ClaimCheck:
    return ClaimCheck(name=name, metric="x", measured=1.0 if ok else 0.0, threshold=0.5, direction=">=",
                      kind="sanity", guards=list(guards))


def test_no_failed_guard_keeps_every_claim():
    v = verdict([_claim("a", True), _claim("b", True), _sanity("s", True, ["a"])])
    assert v["label"] == "holds" and (v["claims_held"], v["claims_total"], v["claims_void"]) == (2, 2, 0)


def test_a_scoped_guard_voids_only_the_claims_it_names():
    checks = [_claim("a", True), _claim("b", False), _claim("c", True), _sanity("regime in cell a", False, ["a"])]
    v = verdict(checks)
    assert [c.void_by for c in checks[:3]] == [["regime in cell a"], [], []]
    assert v["label"] == "partly holds 1/2, 1 void"
    assert (v["claims_held"], v["claims_total"], v["claims_void"]) == (1, 2, 1)
    assert v["sanity_failed"] == ["regime in cell a"]


def test_voiding_cannot_turn_the_awkward_claims_into_a_clean_holds():
    checks = [_claim("a", True), _claim("b", False), _claim("c", False), _claim("d", True),
              _sanity("g", False, ["b", "c"])]
    assert verdict(checks)["label"] == "holds 2/2, 2 void"  # half testable: a verdict, with its voids shown
    assert verdict(checks[:3] + checks[4:])["label"] == "inconclusive (1/3 testable)"
    checks = [_claim("a", True), *[_claim(n, False) for n in "bcd"], _sanity("g", False, ["b", "c", "d"])]
    assert verdict(checks)["label"] == "inconclusive (1/4 testable)"


def test_a_global_guard_voids_every_claim():
    checks = [_claim("a", True), _claim("b", True), _sanity("training converged", False)]
    v = verdict(checks)
    assert v["label"] == "inconclusive (0/2 testable)" and v["claims_void"] == 2 and v["claims_total"] == 0
    assert all(c.void_by == ["training converged"] for c in checks[:2])


def test_a_guard_naming_no_claim_is_an_error_and_only_sanity_checks_guard():
    with pytest.raises(ValueError, match="name no claim"):
        verdict([_claim("a", True), _sanity("s", True, ["typo"])])
    with pytest.raises(ValueError, match="only a sanity check"):
        _claim("a", True, guards=["a"])
    with pytest.raises(ValueError, match="unique"):
        verdict([_claim("a", True), _claim("a", False), _sanity("s", True, ["a"])])


def test_a_method_at_its_natural_bound_cannot_hold_against_the_arm_it_reduces_to():
    c = _claim("better than ERM", True, reduces_to="b")
    assert not c.passed and "reduces to b" in c.detail
    assert _claim("better than ERM", True, reduces_to="another arm").passed  # only against the arm itself


def test_mechanisms_with_a_failed_guard_and_no_claim():
    mech = one_sample_check(name="law", metric="slope", values=[1.0, 1.1, 0.9], direction=">=", threshold=0.5,
                            kind="mechanism")
    assert verdict([mech, _sanity("s", False)])["label"] == "no claim (mechanisms 1/1)"


def _result(checks, schema=3) -> RunResult:
    return RunResult(slug="gcdro", paper={"title": "T", "arxiv": "x", "code": None}, claim="c", mode="full",
                     config={}, seeds=[0, 1, 2, 3], per_seed=[{"seed": i, "metrics": {"m": {"acc": 1.5},
                                                                                        "b": {"acc": 1.0}}}
                                                               for i in range(4)],
                     summary={"m": {"acc": {"mean": 1.5, "std": 0.1, "n": 4}},
                              "b": {"acc": {"mean": 1.0, "std": 0.1, "n": 4}}},
                     claim_checks=checks, env={}, timing={"wall_s": 1.0}, schema_version=schema)


@pytest.mark.parametrize("checks", [
    lambda: [_claim("a", True), _claim("b", True)],
    lambda: [_claim("a", True), _claim("b", False), _sanity("s", False, ["b"])],
    lambda: [_claim("a", True), _claim("b", False), _claim("c", True), _sanity("s", False, ["b", "c"])],
    lambda: [_claim("a", True), _sanity("s", False)],
    lambda: [_sanity("s", False)],
])
def test_schema3_files_pass_the_shared_checker_and_round_trip(tmp_path, checks):
    r = _result(checks())
    path = r.save(tmp_path)
    check_results_file(path)
    d = json.loads(path.read_text())
    assert d["schema_version"] == 3 and "claims_void" in d["verdict"]
    for c in d["claim_checks"]:
        assert ("guards" in c) == (c["kind"] == "sanity") and ("void_by" in c) == (c["kind"] == "claim")
    assert RunResult.load(path).to_dict() == r.to_dict()


def test_report_and_results_md_show_void_claims_with_their_guard(tmp_path):
    r = _result([_claim("a", True), _claim("b", False), _sanity("regime b", False, ["b"])])
    report = render_report(r)
    assert "## Void claims" in report and "void (guard: regime b)" in report and "| b | all claims" not in report
    assert "| regime b |" in report and "| b | " in report
    r.save(tmp_path / "gcdro")
    md = render_results_md(tmp_path)
    assert "| [gcdro](results/gcdro/report.md) | 3 | **holds 1/1, 1 void** | 1/1 | 1 |" in md
    assert "Void claim checks:" in md and "| voided by |" in md and "| regime b |" in md


def test_schema2_files_keep_their_rule_and_round_trip(tmp_path):
    # schema 2: any failed sanity check makes the run inconclusive, whatever it would guard under schema 3
    r2 = _result([_claim("a", True), _claim("b", True), _sanity("s", False)], schema=2)
    assert r2.label.startswith("inconclusive") and "claims_void" not in r2.verdict
    path = r2.save(tmp_path)
    d = json.loads(path.read_text())
    assert d["schema_version"] == 2 and all("guards" not in c and "void_by" not in c for c in d["claim_checks"])
    check_results_file(path)
    again = RunResult.load(path)
    assert again.to_dict() == r2.to_dict() and again.label.startswith("inconclusive")
    for committed in sorted((ROOT / "results").glob("*/results.json")):
        data = json.loads(committed.read_text())
        if data.get("schema_version") in (2, 3):
            loaded = RunResult.from_dict(data)
            assert loaded.verdict["label"] == data["verdict"]["label"], committed
