"""Grid tuning on validation: grids that extend themselves, natural bounds, the one-standard-error rule, and the
model-selection rules of the out-of-distribution literature (DESIGN § Verdicts, DomainBed's names).

:func:`tune_grid` evaluates a grid on validation (mean and standard error over replicate units: seeds, folds,
validation batches). When the best value sits at an edge that is not a declared **natural bound** and beats its
neighbour by more than one standard error, the grid grows on that side by its own ratio (log grids) or step
(linear grids), up to ``max_extra`` points, and is evaluated again. Otherwise the pick is the **one-standard-error
rule** toward the centre of the declared grid: among the values whose mean is within one standard error of the
best, the one nearest the centre (a flat curve or a tie never extends and never picks an edge it does not beat).

A pick at a natural bound (a strength whose limit is the unregularised arm) is legitimate: the arm then *reduces
to* the arm named in ``reduces_to``, and a claim against that arm cannot hold (``ClaimCheck(reduces_to=...)``). A
pick at a hard limit of the knob's domain (``limits``: a probability of 1, a count of 0) is legitimate too: there is
no value beyond it to try. :func:`tuning_check` is the ``sanity`` check: it fails only when a pick is still at an
edge that is neither after the allowed extensions.

Model selection (:func:`select_models`): an out-of-distribution claim declares its rule, and the others are
reported beside it, each picked by the same rule on the same evaluated grid:

- ``training-domain validation``: a held-out split of the training domains (the default, the claim's rule);
- ``leave-one-domain-out``: a held-out shifted domain that is not among the test domains;
- ``test-domain oracle``: a held-out slice of the test domains, disjoint from the test points (an upper bound,
  reported, never the claim);
- ``worst-group validation``: the worst group's validation score (sub-population shift, GroupDRO/JTT).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from icml24.common.results import ClaimCheck

__all__ = ["Tuned", "tune_grid", "repick", "tuning_check", "SELECTION_RULES", "select_models"]

Edge = Literal["low", "high"]
SELECTION_RULES: tuple[str, ...] = ("training-domain validation", "leave-one-domain-out", "test-domain oracle",
                                    "worst-group validation")
Scores = Mapping[str, Sequence[float]]
Evaluate = Callable[[list[float]], Sequence["Scores | Sequence[float]"]]


@dataclass
class Tuned:
    """The outcome of :func:`tune_grid`: the pick, every value evaluated and the extensions made.

    Attributes:
        value: the picked value.
        grid: every value evaluated, sorted (the declared grid plus its extensions).
        declared: the grid as declared in the Config.
        records: per value, every score series the evaluation returned (``score`` is the one tuned on).
        score: the key of ``records`` the pick maximised (or minimised).
        extensions: the values added, in the order they were added.
        natural_bound: the declared natural edge (``"low"``/``"high"``) or None; ``reduces_to`` its arm.
        limits: the knob's hard domain limits (None: unbounded on that side).
    """

    value: float
    grid: list[float]
    declared: list[float]
    records: dict[float, dict[str, list[float]]]
    score: str
    maximize: bool
    log: bool
    max_extra: int
    extensions: list[float] = field(default_factory=list)
    natural_bound: Edge | None = None
    reduces_to: str | None = None
    limits: tuple[float | None, float | None] = (None, None)

    def mean(self, value: float, key: str | None = None) -> float:
        return float(np.mean(self.records[value][key or self.score]))

    def se(self, value: float, key: str | None = None) -> float:
        return _se(self.records[value][key or self.score])

    def at(self, key: str, value: float | None = None) -> list[float]:
        """The per-unit series ``key`` of the picked value (or of ``value``)."""
        return list(self.records[self.value if value is None else value][key])

    @property
    def edge(self) -> Edge | None:
        """Which edge of the evaluated grid the pick sits at, or None when it is strictly inside."""
        if math.isclose(self.value, self.grid[0], rel_tol=1e-12, abs_tol=1e-15):
            return "low"
        if math.isclose(self.value, self.grid[-1], rel_tol=1e-12, abs_tol=1e-15):
            return "high"
        return None

    @property
    def at_natural_bound(self) -> bool:
        return self.edge is not None and self.edge == self.natural_bound

    @property
    def at_limit(self) -> bool:
        """At a hard limit of the knob's domain: nothing beyond it could be tried."""
        bound = {"low": self.limits[0], "high": self.limits[1], None: None}[self.edge]
        return bound is not None and math.isclose(self.value, bound, rel_tol=1e-12, abs_tol=1e-15)

    @property
    def ok(self) -> bool:
        """Strictly inside the evaluated grid, at its declared natural bound, or at a hard domain limit."""
        return self.edge is None or self.at_natural_bound or self.at_limit

    def record(self) -> dict[str, Any]:
        """What a run's ``extra`` keeps of this knob: the pick, the evaluated and declared grids, the extensions,
        where the pick sits, and the validation mean and standard error of every evaluated value."""
        return {"picked": self.value, "grid": list(self.grid), "declared": list(self.declared),
                "extensions": list(self.extensions), "max_extra": self.max_extra, "edge": self.edge, "ok": self.ok,
                "at_natural_bound": self.at_natural_bound, "at_limit": self.at_limit,
                "val_mean": {f"{v:g}": self.mean(v) for v in self.grid},
                "val_se": {f"{v:g}": self.se(v) for v in self.grid}}

    def describe(self) -> str:
        pts = ", ".join(f"{v:.4g}: {self.mean(v):.4g}±{self.se(v):.2g}" for v in self.grid)
        ext = (f"; extended by {', '.join(f'{v:.4g}' for v in self.extensions)}" if self.extensions
               else "; not extended")
        where = ("strictly inside" if self.edge is None else
                 f"at its natural bound ({self.edge}; reduces to {self.reduces_to})" if self.at_natural_bound
                 else f"at the domain's {self.edge} limit" if self.at_limit
                 else f"at the {self.edge} edge after {len(self.extensions)}/{self.max_extra} extensions")
        return f"picked {self.value:.4g} ({where}); validation {self.score} {{{pts}}}{ext}"


def _se(x: Sequence[float]) -> float:
    a = np.asarray(x, dtype=float)
    return float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else 0.0


def _as_scores(out: Scores | Sequence[float], score: str) -> dict[str, list[float]]:
    if isinstance(out, Mapping):
        if score not in out:
            raise KeyError(f"tune_grid: the evaluation returned {sorted(out)}, not the tuned score {score!r}")
        rec = {str(k): [float(v) for v in np.ravel(vals)] for k, vals in out.items()}
    else:
        rec = {score: [float(v) for v in np.ravel(out)]}
    if not rec[score]:
        raise ValueError(f"tune_grid: the evaluation returned no {score!r} scores")
    return rec


def _signed_mean(x: Sequence[float], sign: float) -> float:
    """``sign × mean``; a setting with a non-finite score (diverged) is the worst possible one."""
    m = sign * float(np.mean(x))
    return m if math.isfinite(m) else -math.inf


def _step(grid: Sequence[float], edge: Edge, log: bool) -> float:
    """The next value past ``edge``, by the ratio (log) or step (linear) of the two outermost values there."""
    a, b = (grid[0], grid[1]) if edge == "low" else (grid[-1], grid[-2])
    new = a * (a / b) if log else a + (a - b)
    return float(f"{new:.12g}")  # 3e-3 × 3 is 9e-3, not 0.009000000000000001


def _pick(values: Sequence[float], records: Mapping[float, Mapping[str, Sequence[float]]], score: str, *,
          maximize: bool, declared: Sequence[float], log: bool) -> float:
    """The one-standard-error rule: of the values within one SE of the best mean, the one nearest the centre of
    the ``declared`` grid (in log scale for a log grid), then the smaller one."""
    sign = 1.0 if maximize else -1.0
    val = {v: _signed_mean(records[v][score], sign) for v in values}
    best = max(values, key=lambda v: val[v])
    tol = _se(records[best][score])
    ok = [v for v in values if val[v] >= val[best] - tol]
    f = (lambda v: math.log(v)) if log else float
    centre = (f(min(declared)) + f(max(declared))) / 2
    return min(ok, key=lambda v: (round(abs(f(v) - centre), 9), v))


def tune_grid(evaluate: Evaluate, grid: Sequence[float], *, score: str = "score", maximize: bool = True,
              log: bool = True, max_extra: int = 2, natural_bound: Edge | None = None,
              reduces_to: str | None = None, integer: bool = False,
              limits: tuple[float | None, float | None] = (None, None)) -> Tuned:
    """Tune one knob on validation, extending the grid past an edge that keeps winning.

    Args:
        evaluate: called with a list of values; returns, for each, its validation scores over replicate units
            (a sequence of floats, or a mapping of named series that contains ``score``, e.g. validation and
            test metrics together). Called once with the declared grid, then once per extension.
        grid: the declared grid (>= 2 distinct values; sorted here).
        score: the series to tune on; maximize: higher is better (False for a loss).
        log: the grid is geometric (extend by its ratio; centre in log scale) or linear (by its step).
        max_extra: extensions allowed in total (fixed in the Config before the run; every arm of a comparison
            gets the same budget).
        natural_bound: the edge (``"low"``/``"high"``) at which the arm equals ``reduces_to`` (e.g. a DRO
            strength whose limit is ERM); never extended past, and a pick there is legitimate.
        integer: round extensions to integers (a count such as in-context examples k).
        limits: the knob's hard domain limits, which no value may cross (a probability <= 1, k >= 1); an
            extension stops at them, and a pick there is legitimate (nothing beyond it exists).

    Returns:
        A :class:`Tuned`; its ``ok`` is False only when the pick is at an edge that is neither a natural bound
        nor a hard limit after ``max_extra`` extensions.
    """
    vals = sorted({float(v) for v in grid})
    if len(vals) < 2:
        raise ValueError(f"tune_grid: a grid needs at least 2 distinct values, got {list(grid)}")
    if max_extra < 0:
        raise ValueError(f"tune_grid: max_extra must be >= 0, got {max_extra}")
    if natural_bound not in (None, "low", "high"):
        raise ValueError(f"tune_grid: natural_bound must be 'low', 'high' or None, got {natural_bound!r}")
    if (natural_bound is None) != (reduces_to is None):
        raise ValueError("tune_grid: a natural_bound needs the arm it reduces to (reduces_to), and vice versa")
    if log and vals[0] <= 0:
        raise ValueError(f"tune_grid: a log grid needs positive values, got {vals}; pass log=False")
    lo, hi = limits
    if (lo is not None and vals[0] < lo) or (hi is not None and vals[-1] > hi):
        raise ValueError(f"tune_grid: grid {vals} crosses its limits {limits}")
    records: dict[float, dict[str, list[float]]] = {}

    def run(new: list[float]) -> None:
        outs = evaluate(list(new))
        if len(outs) != len(new):
            raise ValueError(f"tune_grid: evaluate returned {len(outs)} results for {len(new)} values")
        for v, out in zip(new, outs, strict=True):
            records[v] = _as_scores(out, score)

    run(vals)
    extensions: list[float] = []
    sign = 1.0 if maximize else -1.0
    while True:
        means = {v: _signed_mean(records[v][score], sign) for v in vals}
        best = max(vals, key=lambda v: means[v])
        edge: Edge | None = "low" if best == vals[0] else "high" if best == vals[-1] else None
        if edge is None or edge == natural_bound or len(extensions) >= max_extra:
            break
        neighbour = vals[1] if edge == "low" else vals[-2]
        if not means[best] - means[neighbour] > _se(records[best][score]):
            break  # the edge does not beat its neighbour by more than one SE: no evidence the optimum is beyond
        new = _step(vals, edge, log)
        if integer:
            new = float(round(new)) if round(new) != best else best + (1.0 if edge == "high" else -1.0)
        bound = lo if edge == "low" else hi
        if bound is not None and (new < bound if edge == "low" else new > bound):
            if math.isclose(best, bound):
                break  # already at a hard limit
            new = float(bound)
        if new in records or (log and new <= 0):
            break
        run([new])
        extensions.append(new)
        vals = sorted(records)
    value = _pick(vals, records, score, maximize=maximize, declared=grid, log=log)
    return Tuned(value=value, grid=vals, declared=sorted({float(v) for v in grid}), records=records, score=score,
                 maximize=maximize, log=log, max_extra=max_extra, extensions=extensions,
                 natural_bound=natural_bound, reduces_to=reduces_to, limits=(lo, hi))


def repick(tuned: Tuned, *, score: str, maximize: bool | None = None) -> Tuned:
    """The same evaluated grid picked on another series (another selection rule); no new evaluations."""
    missing = [v for v in tuned.grid if score not in tuned.records[v]]
    if missing:
        raise KeyError(f"repick: no {score!r} scores for values {missing}")
    mx = tuned.maximize if maximize is None else maximize
    value = _pick(tuned.grid, tuned.records, score, maximize=mx, declared=tuned.declared, log=tuned.log)
    return Tuned(value=value, grid=list(tuned.grid), declared=list(tuned.declared), records=tuned.records,
                 score=score, maximize=mx, log=tuned.log, max_extra=tuned.max_extra,
                 extensions=list(tuned.extensions), natural_bound=tuned.natural_bound, reduces_to=tuned.reduces_to,
                 limits=tuned.limits)


def tuning_check(*, name: str, tuned: Tuned | Sequence[Tuned], threshold: float = 1.0, arm: str | None = None,
                 guards: Sequence[str] = (), detail: str = "") -> ClaimCheck:
    """The ``sanity`` check of a tuned knob: the fraction of cells whose pick is strictly inside the evaluated
    grid or at its declared natural bound is at least ``threshold`` (fixed before the run; 1 for one pick).

    A pick still at a non-natural edge after the allowed extensions means the arm may not have been tuned,
    so the comparison against it is void for the claims this check ``guards``.
    """
    cells = [tuned] if isinstance(tuned, Tuned) else list(tuned)
    if not cells:
        raise ValueError(f"tuning_check {name!r}: no tuned cells")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"tuning_check {name!r}: threshold must be in [0, 1], got {threshold}")
    ok = sum(t.ok for t in cells)
    natural = sum(t.at_natural_bound for t in cells)
    limit = sum(t.at_limit and not t.at_natural_bound for t in cells)
    edge = len(cells) - ok
    parts = [detail] if detail else []
    parts.append("a tuned value at a non-natural edge of its grid means the arm may not be tuned")
    parts.append(f"{len(cells)} cells: {ok - natural - limit} strictly inside, {natural} at the natural bound, "
                 f"{limit} at a hard domain limit, {edge} at a non-natural edge after extensions")
    if natural and cells[0].reduces_to:
        parts.append(f"at the natural bound {arm or 'the arm'} reduces to {cells[0].reduces_to}")
    parts.append(cells[0].describe() if len(cells) == 1 else
                 "picks: " + ", ".join(f"{t.value:.4g}" for t in cells)
                 + f"; extensions: {sum(len(t.extensions) for t in cells)}")
    return ClaimCheck(name=name, metric="tuned_inside_fraction", measured=ok / len(cells), threshold=threshold,
                      direction=">=", kind="sanity", method_arm=arm, n=len(cells), guards=list(guards),
                      detail="; ".join(parts))


def select_models(evaluate: Evaluate, grid: Sequence[float], *, rule: str = "training-domain validation",
                  report: Sequence[str] = (), maximize: bool = True, **tune_kwargs) -> dict[str, Tuned]:
    """Model selection by a declared rule, with the other rules reported beside it on the same evaluated grid.

    ``evaluate`` returns, per value, a mapping with one series per rule in ``(rule, *report)`` (each a
    validation score over replicate units) plus whatever test metrics the caller wants to read back with
    :meth:`Tuned.at`. The declared ``rule`` drives the grid's extensions (:func:`tune_grid`); each reported
    rule then picks on the grid that was evaluated (:func:`repick`). Returns ``{rule: Tuned}``, declared first.
    """
    names = (rule, *[r for r in report if r != rule])
    unknown = [r for r in names if r not in SELECTION_RULES]
    if unknown:
        raise ValueError(f"select_models: unknown selection rule(s) {unknown}; known: {SELECTION_RULES}")
    if rule == "test-domain oracle":
        raise ValueError("select_models: the test-domain oracle is an upper bound to report, never the claim's rule")
    main = tune_grid(evaluate, grid, score=rule, maximize=maximize, **tune_kwargs)
    return {rule: main, **{r: repick(main, score=r) for r in names[1:]}}
