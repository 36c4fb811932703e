"""Run results: the ``results.json`` schema 3, checks computed from measured numbers, verdicts, Markdown reports.

Schema (``SCHEMA_VERSION`` = 3): ``schema_version, slug, paper{title, arxiv, code}, claim, mode (quick|full),
config, seeds, per_seed[{seed, metrics{arm: {metric: value}}}], summary{arm: {metric: {mean, std, n, ...}}},
claim_checks[{name, kind, metric, baseline_arm, method_arm, direction, margin, threshold, measured, ci_low,
ci_high, n, paper_value, passed, detail, guards (sanity), void_by (claim), reduces_to (claim)}],
verdict{label, claims_held, claims_total, claims_void, mechanisms_held, mechanisms_total, sanity_failed[]},
env{python, torch, numpy, platform, threads, device, git_sha}, timing{started_at, wall_s}, artifacts[...],
command``. Schema 2 (no ``guards``/``void_by``/``claims_void``) is still read, and keeps its own verdict rule.

Check kinds (DESIGN.md § Verdicts): only ``claim`` checks vote; ``mechanism`` checks are shown beside the
verdict; a failed ``sanity`` check *voids* the claims it ``guards`` (by name; none named: every claim). The
verdict is taken over the claims that are not void, and is "inconclusive" when fewer than half are testable.
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

from icml24.common.stats import format_mean_std, one_sample_ci, paired_ci, summarize

SCHEMA_VERSION = 3
READABLE_SCHEMAS: tuple[int, ...] = (2, 3)
Direction = Literal["<=", ">=", "=="]
Kind = Literal["claim", "mechanism", "sanity"]
KINDS: tuple[str, ...] = ("claim", "mechanism", "sanity")


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


@dataclass
class ClaimCheck:
    """One check, computed from measured numbers; ``passed`` is derived here and cannot be passed in.

    ``measured`` is what the check compares (a mean paired difference, a log-ratio, a slope...); ``threshold``
    already includes the ``margin``. With an interval (``ci_low``, ``ci_high``) the *interval* must clear the
    threshold: ``">="`` needs ``ci_low >= threshold``, ``"<="`` needs ``ci_high <= threshold``, ``"=="`` needs the
    whole interval within ``threshold ± margin``. Without one, ``measured`` is compared. A ``claim`` must carry a
    finite interval (use :func:`paired_check` or :func:`one_sample_check`); a NaN anywhere fails the check.
    """

    name: str
    metric: str
    measured: float
    threshold: float
    direction: Direction
    kind: Kind
    baseline_arm: str | None = None
    method_arm: str | None = None
    margin: float = 0.0
    ci_low: float | None = None
    ci_high: float | None = None
    n: int | None = None
    paper_value: str | float | None = None
    detail: str = ""
    guards: list[str] = field(default_factory=list)
    reduces_to: str | None = None
    passed: bool = field(init=False)
    void_by: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.direction not in ("<=", ">=", "=="):
            raise ValueError(f"check {self.name!r}: direction must be '<=', '>=' or '==', got {self.direction!r}")
        if self.kind not in KINDS:
            raise ValueError(f"check {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if (self.ci_low is None) != (self.ci_high is None):
            raise ValueError(f"check {self.name!r}: give both ci_low and ci_high or neither")
        if self.kind == "claim" and self.ci_low is None:
            raise ValueError(f"claim {self.name!r} needs a confidence interval; build it with paired_check or "
                             "one_sample_check (DESIGN.md § Verdicts)")
        self.guards = list(self.guards or [])
        if self.guards and self.kind != "sanity":
            raise ValueError(f"check {self.name!r}: only a sanity check guards claims, this one is a {self.kind}")
        if self.reduces_to is not None and self.kind != "claim":
            raise ValueError(f"check {self.name!r}: reduces_to applies to claims only")
        self.measured, self.threshold = float(self.measured), float(self.threshold)
        has_ci = self.ci_low is not None
        if has_ci:
            self.ci_low, self.ci_high = float(self.ci_low), float(self.ci_high)
        m, t = self.measured, self.threshold
        if not math.isfinite(m) or (has_ci and not (_finite(self.ci_low) and _finite(self.ci_high))):
            self.passed = False
        elif self.direction == ">=":
            self.passed = (self.ci_low if has_ci else m) >= t
        elif self.direction == "<=":
            self.passed = (self.ci_high if has_ci else m) <= t
        else:
            lo, hi = (self.ci_low, self.ci_high) if has_ci else (m, m)
            self.passed = t - self.margin <= lo and hi <= t + self.margin
        if self.reduces_to is not None and self.reduces_to == self.baseline_arm:
            # DESIGN § Verdicts: a method tuned to its natural bound *is* that arm; a claim against it cannot hold
            self.passed = False
            note = f"{self.method_arm or 'the method'} reduces to {self.reduces_to} (tuned to its natural bound)"
            if note not in self.detail:  # from_dict re-derives the check from a detail that already says it
                self.detail = f"{self.detail}. {note}" if self.detail else note

    @property
    def void(self) -> bool:
        return bool(self.void_by)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClaimCheck:
        d = {k: v for k, v in d.items() if k not in ("passed", "void_by")}
        for k in ("ci_low", "ci_high"):  # JSON stores NaN as null and ±inf as strings
            if isinstance(d.get(k), str) or (d.get(k) is None and d.get("kind") == "claim"):
                d[k] = float(d[k]) if isinstance(d.get(k), str) else float("nan")
        return cls(**d)


def paired_check(*, name: str, metric: str, method: Sequence[float], baseline: Sequence[float],
                 direction: Direction, threshold: float = 0.0, kind: Kind = "claim",
                 method_arm: str | None = None, baseline_arm: str | None = None, log_ratio: bool = False,
                 bootstrap: bool = False, paper_value: str | float | None = None, detail: str = "",
                 guards: Sequence[str] = (), reduces_to: str | None = None,
                 clusters: Sequence | None = None) -> ClaimCheck:
    """A check on the paired per-unit differences ``method − baseline`` (or ``log(method/baseline)``).

    "Method better by m" on a higher-is-better metric: ``direction=">=", threshold=m``; "no worse than m":
    ``direction=">=", threshold=-m``; on a lower-is-better metric (a loss): ``direction="<="`` with
    ``threshold=-m`` / ``+m``. The 95% interval of the mean difference must clear the threshold. A ``sanity``
    check names the claims it conditions in ``guards``; a claim whose method arm was tuned to a natural bound
    where it equals the baseline passes ``reduces_to=baseline_arm`` and cannot hold. ``clusters`` (a label per
    pair) selects the two-stage cluster bootstrap.
    """
    st = paired_ci(method, baseline, log_ratio=log_ratio, bootstrap=bootstrap, clusters=clusters)
    what = "log-ratio" if log_ratio else "difference"
    auto = (f"{method_arm or 'method'} − {baseline_arm or 'baseline'} {what}: {st['mean']:.4g} "
            f"[{st['ci_low']:.4g}, {st['ci_high']:.4g}] over n={st['n']} ({_ci_kind(bootstrap, clusters)} 95%)")
    return ClaimCheck(name=name, kind=kind, metric=metric, measured=st["mean"], threshold=threshold,
                      direction=direction, baseline_arm=baseline_arm, method_arm=method_arm, margin=abs(threshold)
                      if direction != "==" else 0.0, ci_low=st["ci_low"], ci_high=st["ci_high"], n=st["n"],
                      paper_value=paper_value, detail=f"{auto}. {detail}".strip() if detail else auto,
                      guards=list(guards), reduces_to=reduces_to)


def _ci_kind(bootstrap: bool, clusters: Sequence | None) -> str:
    if clusters is not None:
        return f"cluster bootstrap over {len(set(np.asarray(clusters).ravel().tolist()))} clusters"
    return "bootstrap" if bootstrap else "t"


def one_sample_check(*, name: str, metric: str, values: Sequence[float], direction: Direction,
                     threshold: float, kind: Kind = "claim", arm: str | None = None, margin: float = 0.0,
                     bootstrap: bool = False, paper_value: str | float | None = None,
                     detail: str = "", guards: Sequence[str] = (), clusters: Sequence | None = None
                     ) -> ClaimCheck:
    """A check on the mean of a per-unit statistic (per-seed slope, correlation, ratio...) with its 95% CI
    (``clusters``: the two-stage cluster bootstrap, see :func:`paired_check`)."""
    st = one_sample_ci(values, bootstrap=bootstrap, clusters=clusters)
    auto = (f"mean {st['mean']:.4g} [{st['ci_low']:.4g}, {st['ci_high']:.4g}] over n={st['n']} "
            f"({_ci_kind(bootstrap, clusters)} 95%)")
    return ClaimCheck(name=name, kind=kind, metric=metric, measured=st["mean"], threshold=threshold,
                      direction=direction, method_arm=arm, margin=margin, ci_low=st["ci_low"],
                      ci_high=st["ci_high"], n=st["n"], paper_value=paper_value,
                      detail=f"{auto}. {detail}".strip() if detail else auto, guards=list(guards))


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
    check_kind: Kind,
    paper_value: str | float | None = None,
    guards: Sequence[str] = (),
) -> ClaimCheck:
    """A ``mechanism``/``sanity`` check on two arms' means (no interval, so never a ``claim``): ``ratio``
    checks ``method/baseline <dir> margin``; ``difference`` checks ``method - baseline <dir> margin``."""
    m = summary[method_arm][metric]["mean"]
    b = summary[baseline_arm][metric]["mean"]
    measured = m / b if kind == "ratio" else m - b
    detail = f"{method_arm}={m:.6g}, {baseline_arm}={b:.6g}, {kind}={measured:.6g}"
    return ClaimCheck(name=name, kind=check_kind, metric=metric, measured=measured, threshold=margin,
                      direction=direction, baseline_arm=baseline_arm, method_arm=method_arm, margin=margin,
                      paper_value=paper_value, detail=detail, guards=list(guards))


def resolve_guards(checks: Sequence[ClaimCheck]) -> None:
    """Set each claim's ``void_by``: the failed sanity checks that guard it (a guard naming no claim: all).

    Raises ``ValueError`` when a sanity check guards a name that is not a claim of the run, or two claims share
    a name (guards are exact names, no patterns).
    """
    claims = [c for c in checks if c.kind == "claim"]
    names = [c.name for c in claims]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup and any(c.guards for c in checks):
        raise ValueError(f"claim names must be unique for guards to name them; repeated: {dup}")
    for s in checks:
        unknown = [g for g in s.guards if g not in names]
        if unknown:
            raise ValueError(f"sanity check {s.name!r} guards {unknown}, which name no claim of this run "
                             f"(claims: {names})")
    failed = [s for s in checks if s.kind == "sanity" and not s.passed]
    for c in claims:
        c.void_by = sorted(s.name for s in failed if not s.guards or c.name in s.guards)


def _label(held: int, n: int) -> str:
    return "holds" if held == n else "does not hold" if held == 0 else "partly holds"


def verdict(checks: Sequence[ClaimCheck], *, schema: int = SCHEMA_VERSION) -> dict[str, Any]:
    """The run's verdict, from the checks alone (DESIGN.md § Verdicts).

    Schema 3: a failed sanity check voids the claims it guards; over the claims that are not void, ``holds``
    (all), ``partly holds``, ``does not hold`` (none), with "k/n, v void" beside it when some are void;
    ``inconclusive (t/n testable)`` when fewer than half of the claims are testable; ``no claim (mechanisms
    k/n)`` when there is no claim. Mechanisms never vote. Schema 2 (read only): any failed sanity check makes
    the run ``inconclusive``.
    """
    if schema not in READABLE_SCHEMAS:
        raise ValueError(f"verdict: schema {schema!r} is not one of {READABLE_SCHEMAS}")
    claims = [c for c in checks if c.kind == "claim"]
    mechs = [c for c in checks if c.kind == "mechanism"]
    sanity_failed = [c.name for c in checks if c.kind == "sanity" and not c.passed]
    m_held = sum(c.passed for c in mechs)
    if schema == 2:  # no guards: a failed sanity check makes the whole run inconclusive below
        for c in claims:
            c.void_by = []
    else:
        resolve_guards(checks)
    live = [c for c in claims if not c.void]
    held, void = sum(c.passed for c in live), len(claims) - len(live)
    if schema == 2 and sanity_failed:
        label = "inconclusive"
    elif not claims:
        label = f"no claim (mechanisms {m_held}/{len(mechs)})"
    elif 2 * len(live) < len(claims):
        label = f"inconclusive ({len(live)}/{len(claims)} testable)"
    elif void:
        label = f"{_label(held, len(live))} {held}/{len(live)}, {void} void"
    else:
        label = _label(held, len(live))
    out = {"label": label, "claims_held": held, "claims_total": len(live), "mechanisms_held": m_held,
           "mechanisms_total": len(mechs), "sanity_failed": sanity_failed}
    if schema >= 3:
        out["claims_void"] = void
    return out


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
    verdict: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.verdict = verdict(self.claim_checks, schema=self.schema_version)

    @property
    def label(self) -> str:
        return self.verdict["label"]

    @property
    def claims_held(self) -> int:
        return self.verdict["claims_held"]

    @property
    def passed(self) -> bool:
        """True when the verdict is "holds" with no claim void (every claim holds, no sanity check failed)."""
        return self.label == "holds"

    def check_groups(self) -> dict[str, list[ClaimCheck]]:
        """The checks as reports show them: claims that vote, void claims, mechanisms, sanity checks."""
        claims = self.checks("claim")
        return {"claim": [c for c in claims if not c.void], "void": [c for c in claims if c.void],
                "mechanism": self.checks("mechanism"), "sanity": self.checks("sanity")}

    def checks(self, kind: Kind) -> list[ClaimCheck]:
        return [c for c in self.claim_checks if c.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["claim_checks"] = [_check_dict(c, self.schema_version) for c in self.claim_checks]
        return _jsonable(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        if d.get("schema_version") not in READABLE_SCHEMAS:
            raise ValueError(f"results schema_version {d.get('schema_version')!r} is not one of {READABLE_SCHEMAS}")
        d = {k: v for k, v in d.items() if k != "verdict"}
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


def _check_dict(c: ClaimCheck, schema: int) -> dict[str, Any]:
    """A check as stored: schema 3 keeps ``guards`` on sanity checks and ``void_by``/``reduces_to`` on claims."""
    d = asdict(c)
    if schema < 3 or c.kind != "sanity":
        d.pop("guards")
    if schema < 3 or c.kind != "claim":
        d.pop("void_by")
        d.pop("reduces_to")
    elif d["reduces_to"] is None:
        d.pop("reduces_to")
    return d


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

    def values(self, arm: str, metric: str) -> list[float]:
        """``metric`` of ``arm`` per seed, in the order the seeds were added (the pairing order)."""
        out = []
        for row in self.per_seed:
            try:
                out.append(float(row["metrics"][arm][metric]))
            except KeyError:
                raise KeyError(f"seed {row['seed']} has no {arm!r}/{metric!r}") from None
        return out

    def paired(self, *, name: str, metric: str, method_arm: str, baseline_arm: str, direction: Direction,
               threshold: float = 0.0, kind: Kind = "claim", **kwargs: Any) -> ClaimCheck:
        """:func:`paired_check` of two arms' per-seed ``metric`` values recorded with :meth:`add_seed`."""
        return paired_check(name=name, metric=metric, method=self.values(method_arm, metric),
                            baseline=self.values(baseline_arm, metric), direction=direction,
                            threshold=threshold, kind=kind, method_arm=method_arm, baseline_arm=baseline_arm,
                            **kwargs)

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


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def format_measured(c: ClaimCheck) -> str:
    """``measured [ci_low, ci_high]`` (or just measured when the check has no interval)."""
    ci = f" [{_fmt(c.ci_low)}, {_fmt(c.ci_high)}]" if c.ci_low is not None else ""
    return f"{c.measured:.4g}{ci}"


def check_status(c: ClaimCheck) -> str:
    """``holds`` / ``**does not hold**``, or ``void (guard: …)`` for a claim a failed sanity check voids."""
    if c.void_by:
        return f"void (guard: {'; '.join(c.void_by)})"
    return "holds" if c.passed else "**does not hold**"


def guard_scope(c: ClaimCheck) -> str:
    """What a sanity check conditions: the claims it names, or every claim."""
    return "; ".join(c.guards) if c.guards else "all claims"


def check_table(r: RunResult, checks: Sequence[ClaimCheck]) -> list[str]:
    """Markdown table of checks: arms' mean ± std, measured with its 95% CI, threshold, n, paper, verdict;
    sanity checks add the claims they guard."""
    sanity = r.schema_version >= 3 and all(c.kind == "sanity" for c in checks)
    head = "| check | metric | baseline mean ± std | method mean ± std | measured [95% CI] | threshold | n | paper |"
    lines = [head + (" guards |" if sanity else "") + " verdict |",
             "|---" * (10 if sanity else 9) + "|"]
    for c in checks:
        base = r.summary.get(c.baseline_arm or "", {}).get(c.metric)
        meth = r.summary.get(c.method_arm or "", {}).get(c.metric)
        b = f"{c.baseline_arm}: {format_mean_std(base)}" if base else (c.baseline_arm or "—")
        m = f"{c.method_arm}: {format_mean_std(meth)}" if meth else (c.method_arm or "—")
        thr = f"{c.direction} {c.threshold:.4g}" + (f" ± {c.margin:.4g}" if c.direction == "==" else "")
        lines.append(f"| {c.name} | {c.metric} | {b} | {m} | {format_measured(c)} | {thr} | {c.n or '—'} | "
                     f"{c.paper_value if c.paper_value is not None else '—'} | "
                     + (f"{guard_scope(c)} | " if sanity else "") + f"{check_status(c)} |")
    return lines


_KIND_TITLES = {"claim": "Claims (these make the verdict)",
                "void": "Void claims (a failed sanity check guards them: shown, not counted)",
                "mechanism": "Mechanisms (shown beside the verdict, never counted)",
                "sanity": "Sanity checks (a failure voids the claims it guards)"}


def verdict_line(v: dict[str, Any]) -> str:
    """``label — claims k/n[, v void], mechanisms k/n, sanity …`` for reports and the CLI."""
    void = f", {v['claims_void']} void" if v.get("claims_void") else ""
    return (f"{v['label']} — claims {v['claims_held']}/{v['claims_total']}{void}, mechanisms "
            f"{v['mechanisms_held']}/{v['mechanisms_total']}, sanity "
            + (f"failed: {', '.join(v['sanity_failed'])}" if v["sanity_failed"] else "all pass"))


def render_report(r: RunResult) -> str:
    """The per-run ``report.md``: verdict, then claims, mechanisms and sanity checks in separate tables."""
    lines = [f"# {r.slug}: {r.paper.get('title', '')}", ""]
    if r.paper.get("arxiv"):
        lines.append(f"arXiv: {r.paper['arxiv']} · official code: {r.paper.get('code') or 'none'}  ")
    lines += [f"Mode: **{r.mode}** · seeds: {r.seeds} · wall time: {r.timing.get('wall_s', 0):.1f} s", "",
              f"**Claim.** {r.claim}", "",
              f"**Verdict: {verdict_line(r.verdict).replace(' — ', '** — ', 1)}", ""]
    for kind, checks in r.check_groups().items():
        if checks:
            lines += [f"## {_KIND_TITLES[kind]}", "", *check_table(r, checks), ""]
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
