"""Run results: the ``results.json`` schema, claim checks computed from measured numbers, Markdown reports.

Schema (``SCHEMA_VERSION``): ``schema_version, slug, paper{title, arxiv, code}, claim, mode (quick|full),
config, seeds, per_seed[{seed, metrics{arm: {metric: value}}}], summary{arm: {metric: {mean, std, n, ...}}},
claim_checks[{name, metric, baseline_arm, method_arm, direction, margin, threshold, measured, paper_value,
passed, detail}], env{python, torch, numpy, platform, threads, device, git_sha}, timing{started_at, wall_s},
artifacts[...], command``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from icml24.common.stats import format_mean_std, summarize

SCHEMA_VERSION = 1
Direction = Literal["<=", ">=", "=="]


@dataclass
class ClaimCheck:
    """One claim, checked from measured numbers: ``passed = measured <direction> threshold``.

    ``measured`` is whatever the claim compares (a ratio of two arms, a difference, a correlation...);
    ``threshold`` already includes the ``margin``. ``passed`` is computed here and cannot be passed in.
    For ``"=="``, ``passed`` means ``|measured - threshold| <= margin``.
    """

    name: str
    metric: str
    measured: float
    threshold: float
    direction: Direction
    baseline_arm: str | None = None
    method_arm: str | None = None
    margin: float = 0.0
    paper_value: str | float | None = None
    detail: str = ""
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        if self.direction not in ("<=", ">=", "=="):
            raise ValueError(f"direction must be '<=', '>=' or '==', got {self.direction!r}")
        m = float(self.measured)
        t = float(self.threshold)
        if not math.isfinite(m):
            self.passed = False
        elif self.direction == "<=":
            self.passed = m <= t
        elif self.direction == ">=":
            self.passed = m >= t
        else:
            self.passed = abs(m - t) <= self.margin
        self.measured, self.threshold = m, t

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClaimCheck:
        d = {k: v for k, v in d.items() if k != "passed"}
        return cls(**d)


def compare_arms(
    summary: dict[str, dict[str, dict[str, float]]],
    *,
    name: str,
    metric: str,
    baseline_arm: str,
    method_arm: str,
    direction: Direction,
    margin: float,
    kind: Literal["ratio", "difference"],
    paper_value: str | float | None = None,
) -> ClaimCheck:
    """Claim on two arms' means: ``ratio`` checks ``method/baseline <dir> margin``; ``difference`` checks
    ``method - baseline <dir> margin`` (e.g. ``>= -0.5`` for "within 0.5 points")."""
    m = summary[method_arm][metric]["mean"]
    b = summary[baseline_arm][metric]["mean"]
    measured = m / b if kind == "ratio" else m - b
    detail = f"{method_arm}={m:.6g}, {baseline_arm}={b:.6g}, {kind}={measured:.6g}"
    return ClaimCheck(name=name, metric=metric, measured=measured, threshold=margin, direction=direction,
                      baseline_arm=baseline_arm, method_arm=method_arm, margin=margin,
                      paper_value=paper_value, detail=detail)


def summarize_per_seed(per_seed: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """``summary[arm][metric] = {mean, std, n, ci_low, ci_high}`` over the seeds that report it."""
    collected: dict[str, dict[str, list[float]]] = {}
    for row in per_seed:
        for arm, metrics in row["metrics"].items():
            for metric, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    collected.setdefault(arm, {}).setdefault(metric, []).append(float(value))
    return {arm: {k: summarize(v) for k, v in ms.items()} for arm, ms in collected.items()}


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: str = "cpu") -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "git_sha": _git_sha(),
    }


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().tolist()
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@dataclass
class RunResult:
    """Everything one ``run(cfg, out_dir)`` measured; serialises to ``results.json``."""

    slug: str
    paper: dict[str, str | None]
    claim: str
    mode: Literal["quick", "full"]
    config: dict[str, Any]
    seeds: list[int]
    per_seed: list[dict[str, Any]]
    summary: dict[str, dict[str, dict[str, float]]]
    claim_checks: list[ClaimCheck]
    env: dict[str, Any]
    timing: dict[str, Any]
    artifacts: list[str] = field(default_factory=list)
    command: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def claims_held(self) -> int:
        return sum(c.passed for c in self.claim_checks)

    @property
    def passed(self) -> bool:
        return bool(self.claim_checks) and all(c.passed for c in self.claim_checks)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["claim_checks"] = [asdict(c) for c in self.claim_checks]
        return _jsonable(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"results schema_version {d.get('schema_version')!r} != {SCHEMA_VERSION}")
        d = dict(d)
        d["claim_checks"] = [ClaimCheck.from_dict(c) for c in d["claim_checks"]]
        return cls(**d)

    def save(self, out_dir: Path) -> Path:
        """Write ``results.json`` and ``report.md`` into ``out_dir`` (atomically); returns the JSON path."""
        out_dir = Path(out_dir)
        path = out_dir / "results.json"
        write_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")
        write_atomic(out_dir / "report.md", render_report(self))
        return path

    @classmethod
    def load(cls, path: Path) -> RunResult:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


class RunRecorder:
    """Collects per-seed metrics inside an experiment's ``run`` and builds the :class:`RunResult`.

    Usage::

        rec = RunRecorder(slug, cfg, out_dir)
        for seed in cfg.seeds: rec.add_seed(seed, {"lora": {"loss": ...}, "loraplus": {"loss": ...}})
        checks = [compare_arms(rec.summary(), ...)]
        return rec.finish(checks, artifacts=[...])
    """

    def __init__(self, slug: str, cfg: Any, out_dir: Path) -> None:
        from icml24.registry import PAPERS

        self.slug = slug
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.per_seed: list[dict[str, Any]] = []
        self.started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.t0 = time.perf_counter()
        self.paper = PAPERS[slug]
        self._caller_threads = torch.get_num_threads()
        if getattr(cfg, "threads", 0):
            torch.set_num_threads(cfg.threads)

    def add_seed(self, seed: int, metrics: dict[str, dict[str, Any]]) -> None:
        self.per_seed.append({"seed": int(seed), "metrics": _jsonable(metrics)})

    def summary(self) -> dict[str, dict[str, dict[str, float]]]:
        return summarize_per_seed(self.per_seed)

    def finish(self, claim_checks: list[ClaimCheck], *, artifacts: Sequence[str | Path] = (),
               extra: dict[str, Any] | None = None) -> RunResult:
        cfg = self.cfg
        result = RunResult(
            slug=self.slug,
            paper={"title": self.paper.title, "arxiv": self.paper.arxiv, "code": self.paper.code},
            claim=self.paper.claim,
            mode="quick" if is_quick(cfg) else "full",
            config=_jsonable(cfg.to_dict()),
            seeds=list(cfg.seeds),
            per_seed=self.per_seed,
            summary=self.summary(),
            claim_checks=list(claim_checks),
            env=environment(getattr(cfg, "device", "cpu")),
            timing={"started_at": self.started, "wall_s": round(time.perf_counter() - self.t0, 3)},
            artifacts=sorted({Path(a).name for a in artifacts}),
            command=command_for(self.slug, cfg),
            extra=_jsonable(extra or {}),
        )
        result.save(self.out_dir)
        torch.set_num_threads(self._caller_threads)
        return result


def is_quick(cfg: Any) -> bool:
    """A config is in quick mode when it is closer (fewer differing fields) to ``quick()`` than to the defaults."""
    cls = type(cfg)
    return len(_diff(cfg, cls.quick())) < len(_diff(cfg, cls()))


def command_for(slug: str, cfg: Any) -> str:
    """The CLI line that reproduces ``cfg``: ``--quick`` when in quick mode, plus ``--seeds``/``--set`` overrides."""
    quick = is_quick(cfg)
    ref = type(cfg).quick() if quick else type(cfg)()
    parts = [f"icml24 run {slug}" + (" --quick" if quick else "")]
    for k, v in _diff(cfg, ref).items():
        if k == "seeds":
            parts.append("--seeds " + " ".join(str(s) for s in v))
        elif k == "device":
            parts.append(f"--device {v}")
        else:
            val = ",".join(str(x) for x in v) if isinstance(v, (tuple, list)) else str(v)
            parts.append(f"--set {k}={val}")
    return " ".join(parts)


def _diff(cfg: Any, ref: Any) -> dict[str, Any]:
    a, b = cfg.to_dict(), ref.to_dict()
    return {k: a[k] for k in a if a[k] != b.get(k)}


def render_report(r: RunResult) -> str:
    """The per-run ``report.md``: claim table with baseline and method means ± std, verdicts, plots, command."""
    lines = [f"# {r.slug}: {r.paper.get('title', '')}", ""]
    if r.paper.get("arxiv"):
        lines.append(f"arXiv: {r.paper['arxiv']} · official code: {r.paper.get('code') or 'none'}  ")
    lines += [f"Mode: **{r.mode}** · seeds: {r.seeds} · wall time: {r.timing.get('wall_s', 0):.1f} s", "",
              f"**Claim.** {r.claim}", "", "## Claim checks", "",
              "| check | metric | baseline mean ± std | method mean ± std | measured | threshold | paper | verdict |",
              "|---|---|---|---|---|---|---|---|"]
    for c in r.claim_checks:
        base = r.summary.get(c.baseline_arm or "", {}).get(c.metric)
        meth = r.summary.get(c.method_arm or "", {}).get(c.metric)
        b = f"{c.baseline_arm}: {format_mean_std(base)}" if base else (c.baseline_arm or "—")
        m = f"{c.method_arm}: {format_mean_std(meth)}" if meth else (c.method_arm or "—")
        verdict = "holds" if c.passed else "does not hold"
        lines.append(f"| {c.name} | {c.metric} | {b} | {m} | {c.measured:.4g} | {c.direction} {c.threshold:.4g} | "
                     f"{c.paper_value if c.paper_value is not None else '—'} | **{verdict}** |")
    lines += ["", f"Verdict: {r.claims_held}/{len(r.claim_checks)} claim checks hold.", ""]
    details = [f"- {c.name}: {c.detail}" for c in r.claim_checks if c.detail]
    if details:
        lines += ["Details:", "", *details, ""]
    lines += ["## All arms (mean ± std over seeds)", ""]
    metrics = sorted({m for arm in r.summary.values() for m in arm})
    if metrics:
        lines += ["| arm | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
        for arm, ms in r.summary.items():
            lines.append(f"| {arm} | " + " | ".join(format_mean_std(ms.get(m)) for m in metrics) + " |")
    pngs = [a for a in r.artifacts if a.endswith(".png")]
    if pngs:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in pngs]
    lines += ["", "## Reproduce", "", "```", r.command, "```", "",
              f"Environment: python {r.env.get('python')}, torch {r.env.get('torch')}, numpy {r.env.get('numpy')}, "
              f"{r.env.get('threads')} threads, device {r.env.get('device')}, git {r.env.get('git_sha')}.", ""]
    return "\n".join(lines)
