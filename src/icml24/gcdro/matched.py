"""Matched-strength worst cases: set each DRO arm's knob so that its worst case q is at a given total-variation
distance from the empirical distribution p̂ (uniform), ``TV(q, p̂) = ½ Σ_i |q_i − 1/n|``.

DRO arms differ in what their knob means (a temperature, a penalty, a level, a flow time), so comparing them at
their own default knobs compares radii, not geometry. Here every knob is found by bisection on TV:

* :func:`bisect_knob` — a scalar knob with TV monotone in it (KL / χ² penalties, GCDRO's free-energy temperature);
* :func:`flow_at_tv` — a flow-time knob (GDRO's horizon): Euler steps until TV reaches the level, the last step
  shortened by bisection so that TV equals the level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from icml24.common import validate as v
from icml24.gcdro import core

__all__ = ["Matched", "bisect_knob", "flow_at_tv", "cvar_at_tv"]


@dataclass(frozen=True)
class Matched:
    """A worst case matched to a TV level: the knob value, q, its TV and whether the level was reached."""

    knob: float
    q: torch.Tensor
    tv: float
    reached: bool


def _check_level(level: float) -> None:
    v.probability("gcdro", "level (TV from uniform)", level, open_low=True, open_high=True)


def bisect_knob(weights_of: Callable[[float], torch.Tensor], level: float, *, lo: float, hi: float,
                decreasing: bool = True, iters: int = 40, rtol: float = 0.01, n_grid: int = 0,
                cache: dict[float, torch.Tensor] | None = None) -> Matched:
    """Bisection on ``log knob`` in ``[lo, hi]`` for ``TV(weights_of(knob)) = level``.

    Args:
        weights_of: knob ↦ q (a probability vector).
        level: target TV distance from uniform, in (0, 1).
        lo, hi: knob bracket, ``0 < lo < hi``.
        decreasing: TV decreases as the knob grows (temperatures, penalties); else increases.
        iters: at most this many bisection steps.
        rtol: stop once ``|TV − level| <= rtol · level``.
        n_grid: if > 0, first evaluate TV on ``n_grid`` log-spaced knobs and bisect inside the first pair of
            neighbours (from the weak end) that straddles the level; this needs TV continuous in the knob only,
            not monotone (an explicit flow can be non-monotone at extreme knobs).
        cache: optional dict knob ↦ q reused across calls (e.g. several levels on the same grid).

    Returns:
        :class:`Matched`; ``reached=False`` (with the closest q seen) when no knob in the bracket reaches the
        level within ``rtol``.
    """
    _check_level(level)
    v.positive("gcdro", "lo", lo)
    if not hi > lo:
        raise ValueError(f"gcdro: bisect_knob needs hi > lo, got lo={lo}, hi={hi}")
    v.integer("gcdro", "iters", iters, minimum=1)
    v.positive("gcdro", "rtol", rtol)
    v.integer("gcdro", "n_grid", n_grid, minimum=0)
    cache = {} if cache is None else cache
    seen: list[tuple[float, torch.Tensor, float]] = []

    def evaluate(log_knob: float) -> float:
        knob = float(np.exp(log_knob))
        if knob not in cache:
            cache[knob] = weights_of(knob)
        tv = core.tv_from_uniform(cache[knob])
        seen.append((knob, cache[knob], tv))
        return tv

    def result() -> Matched:
        knob, q, tv = min(seen, key=lambda t: abs(t[2] - level))
        return Matched(knob, q, tv, abs(tv - level) <= rtol * level)

    log_lo, log_hi = float(np.log(lo)), float(np.log(hi))
    pts = list(np.linspace(log_lo, log_hi, max(n_grid, 2)))
    if decreasing:
        pts = pts[::-1]  # from the weak end (near-uniform q) to the strong end
    weak = strong = None
    prev = None
    for p in pts:
        if evaluate(p) >= level:
            weak, strong = prev, p
            break
        prev = p
    if strong is None or weak is None:  # never reaches the level, or already above it at the weak end
        return result()
    for _ in range(iters):
        if abs(seen[-1][2] - level) <= rtol * level:
            break
        mid = 0.5 * (weak + strong)
        if evaluate(mid) >= level:
            strong = mid
        else:
            weak = mid
    return result()


def cvar_at_tv(losses: torch.Tensor, level: float) -> Matched:
    """CVaR at TV = level: uniform mass on the top ``1 − level`` fraction has ``TV = level`` exactly."""
    _check_level(level)
    q = core.cvar_worst_case(losses, alpha=1.0 - level)
    tv = core.tv_from_uniform(q)
    return Matched(1.0 - level, q, tv, True)


def flow_at_tv(losses: torch.Tensor, edges: core.EdgeList, level: float, *, alpha: float = 0.0, beta: float = 0.0,
               max_steps: int = 3000, step_scale: float = 0.5, rtol: float = 0.01) -> Matched:
    """The gradient flow from p̂ run for the flow time at which ``TV(q_t, p̂) = level`` (the knob is the time).

    Adaptive Euler steps of :func:`core.gradient_flow`; the step that crosses the level is shortened by
    bisection. ``reached=False`` when ``max_steps`` steps (or an equilibrium) stay below the level.
    """
    _check_level(level)
    v.integer("gcdro", "max_steps", max_steps, minimum=1)
    ell = losses.detach().to(device=edges.w.device, dtype=edges.w.dtype)
    n = edges.n
    q = torch.full((n,), 1.0 / n, dtype=ell.dtype, device=ell.device)
    t = 0.0
    for _ in range(max_steps):
        phi = core.chemical_potential(q, ell, edges, alpha=alpha, beta=beta)
        tau = core.adaptive_step(phi, edges, step_scale=step_scale, q=q, alpha=alpha, beta=beta)
        if not torch.isfinite(tau):
            break
        flux = core.upwind_flux(q, phi, edges)

        def step(frac: float, q: torch.Tensor = q, flux: torch.Tensor = flux, tau: torch.Tensor = tau
                 ) -> torch.Tensor:
            nq = (q + frac * tau * flux).clamp_min(1e-12)
            return nq / nq.sum()

        nq = step(1.0)
        tv = core.tv_from_uniform(nq)
        if tv >= level:
            lo_f, hi_f = 0.0, 1.0
            for _ in range(50):
                mid = 0.5 * (lo_f + hi_f)
                tv_mid = core.tv_from_uniform(step(mid))
                if abs(tv_mid - level) <= rtol * level:
                    lo_f = hi_f = mid
                    break
                lo_f, hi_f = (mid, hi_f) if tv_mid < level else (lo_f, mid)
            nq = step(hi_f)
            return Matched(t + hi_f * float(tau), nq, core.tv_from_uniform(nq), True)
        q, t = nq, t + float(tau)
    return Matched(t, q, core.tv_from_uniform(q), False)
