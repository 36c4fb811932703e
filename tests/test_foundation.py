"""The package foundation: registry, CLI, config overrides, results schema, stats."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from icml24 import cli, registry
from icml24.common.config import ExperimentConfig
from icml24.common.results import ClaimCheck, RunRecorder, RunResult, compare_arms, is_quick
from icml24.common.stats import mean_std, paired_difference, summarize
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
    (["run", "loraplus", "--quick", "--set", "steps=0"], "steps must be >= 1"),
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


def test_claim_check_computes_its_verdict():
    assert ClaimCheck(name="a", metric="m", measured=0.5, threshold=0.9, direction="<=").passed
    assert not ClaimCheck(name="a", metric="m", measured=0.95, threshold=0.9, direction="<=").passed
    assert not ClaimCheck(name="a", metric="m", measured=float("nan"), threshold=0.9, direction=">=").passed
    with pytest.raises(TypeError):
        ClaimCheck(name="a", metric="m", measured=1, threshold=0, direction=">=", passed=False)


def test_results_schema_round_trip_and_report(tmp_path):
    cfg = _Cfg.quick().replace(seeds=(5, 6, 7))
    rec = RunRecorder("loraplus", cfg, tmp_path)
    for s in cfg.seeds:
        rec.add_seed(s, {"lora": {"loss": 1.0 + s - 5}, "loraplus": {"loss": 0.5 + s - 5}})
    check = compare_arms(rec.summary(), name="ratio", metric="loss", baseline_arm="lora", method_arm="loraplus",
                         direction="<=", margin=0.9, kind="ratio")
    res = rec.finish([check])
    data = json.loads((tmp_path / "results.json").read_text())
    for key in ["schema_version", "slug", "paper", "claim", "mode", "config", "seeds", "per_seed", "summary",
                "claim_checks", "env", "timing"]:
        assert key in data
    assert set(data["env"]) == {"python", "torch", "numpy", "platform", "threads", "device", "git_sha"}
    assert data["summary"]["lora"]["loss"]["mean"] == pytest.approx(2.0)
    assert data["claim_checks"][0]["measured"] == pytest.approx(1.5 / 2.0) and data["claim_checks"][0]["passed"]
    assert RunResult.load(tmp_path / "results.json").to_dict() == res.to_dict()
    assert data["mode"] == "quick" and data["command"] == "icml24 run loraplus --quick --seeds 5 6 7"
    report = (tmp_path / "report.md").read_text()
    assert "| metric | baseline mean ± std | method mean ± std |" in report
    assert "holds" in report and "icml24 run loraplus" in report
    (tmp_path / "loraplus").mkdir()
    (tmp_path / "results.json").rename(tmp_path / "loraplus" / "results.json")
    md = render_results_md(tmp_path)
    assert "| [loraplus](results/loraplus/report.md) | 1/1 | **holds**" in md


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
            rec.add_seed(s, {"base": {"loss": 1.0}, "method": {"loss": cfg.lr}})
        return rec.finish([compare_arms(rec.summary(), name="c", metric="loss", baseline_arm="base",
                                        method_arm="method", direction="<=", margin=1.0, kind="ratio")])


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
    assert "| loraplus | 1/1 claims hold |" in capsys.readouterr().out


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
    assert "| loraplus | CRASHED: RuntimeError: boom |" in out and "| mola | 1/1 claims hold |" in out
