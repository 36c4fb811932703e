"""Input validation, once: the handful of rules every public API and Config uses.

Each function checks one public argument and returns it (converted where that is harmless, e.g. an int-valued
numpy scalar to ``int``), or raises a ``ValueError``/``TypeError`` whose message names the owner and the
argument: ``"mola: num_experts must be an int >= 1, got 0"``; a wrong type raises ``ArgumentTypeError``
(both a ``TypeError`` and a ``ValueError``). They are for public parameters, shapes and dtypes
only — never branch on a property of a private record (DESIGN.md § Code conventions).

Usage::

    from icml24.common import validate as v
    v.positive("ExpSGDM", "lr", lr)
    v.in_range("SemiDPSGD", "beta", beta, 0.0, 1.0)          # closed [0, 1]
    v.in_range("Config", "val_fraction", f, 0.0, 1.0, low_open=True, high_open=True)
    v.integer("mola", "num_experts", k, minimum=1)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["ArgumentTypeError", "finite", "positive", "non_negative", "in_range", "probability", "integer",
           "one_of", "tensor", "same_length", "privacy_budget", "each", "at_least"]


class ArgumentTypeError(TypeError, ValueError):
    """A public argument of the wrong type. A ``TypeError``, and a ``ValueError`` too, so that callers catching
    ``ValueError`` for any bad argument (as the hand-written checks these rules replace raised) keep working."""


def _is_real(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, torch.Tensor):
        return x.numel() == 1 and not x.is_complex()
    return isinstance(x, numbers.Real)


def _real(owner: str, name: str, x: Any, what: str) -> float:
    if not _is_real(x):
        raise ArgumentTypeError(f"{owner}: {name} must be {what}, got {type(x).__name__} {x!r}")
    return float(x)


def finite(owner: str, name: str, x: Any) -> float:
    """A finite real number (int, float, numpy or 0-d tensor scalar); returns it as ``float``."""
    v = _real(owner, name, x, "a finite number")
    if not math.isfinite(v):
        raise ValueError(f"{owner}: {name} must be a finite number, got {x!r}")
    return v


def at_least(owner: str, name: str, x: Any, low: float, *, strict: bool = False) -> float:
    """A finite number >= ``low`` (> ``low`` when ``strict``), e.g. a ratio >= 1."""
    what = f"a finite number {'>' if strict else '>='} {low:g}"
    v = _real(owner, name, x, what)
    if not (math.isfinite(v) and (v > low if strict else v >= low)):
        raise ValueError(f"{owner}: {name} must be {what}, got {x!r}")
    return v


def positive(owner: str, name: str, x: Any) -> float:
    """A finite number > 0."""
    return at_least(owner, name, x, 0, strict=True)


def non_negative(owner: str, name: str, x: Any) -> float:
    """A finite number >= 0."""
    return at_least(owner, name, x, 0)


def in_range(owner: str, name: str, x: Any, low: float, high: float, *, low_open: bool = False,
             high_open: bool = False) -> float:
    """A finite number in the interval from ``low`` to ``high`` (closed unless ``low_open``/``high_open``)."""
    span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    v = _real(owner, name, x, f"a number in {span}")
    ok = math.isfinite(v) and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    if not ok:
        raise ValueError(f"{owner}: {name} must be in {span}, got {x!r}")
    return v


def probability(owner: str, name: str, x: Any, *, open_low: bool = False, open_high: bool = False) -> float:
    """A probability in [0, 1] (ends excluded on request)."""
    return in_range(owner, name, x, 0.0, 1.0, low_open=open_low, high_open=open_high)


def privacy_budget(owner: str, epsilon: Any, delta: Any = None, *, epsilon_name: str = "epsilon",
                   delta_name: str = "delta") -> tuple[float, float | None]:
    """A differential-privacy budget: ε a finite number > 0 and, unless ``delta`` is None, δ in (0, 1)."""
    eps = positive(owner, epsilon_name, epsilon)
    if delta is None:
        return eps, None
    return eps, in_range(owner, delta_name, delta, 0.0, 1.0, low_open=True, high_open=True)


def integer(owner: str, name: str, x: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (Python or numpy; not bool, not a float) within ``[minimum, maximum]``; returns ``int``."""
    if minimum is not None and maximum is not None:
        bound = f" in [{minimum}, {maximum}]"
    else:
        bound = (f" >= {minimum}" if minimum is not None else "") + (f" <= {maximum}" if maximum is not None else "")
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise ArgumentTypeError(f"{owner}: {name} must be an int{bound}, got {type(x).__name__} {x!r}")
    v = int(x)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise ValueError(f"{owner}: {name} must be an int{bound}, got {x!r}")
    return v


def one_of(owner: str, name: str, x: Any, choices: Sequence[Any]) -> Any:
    """One of ``choices``."""
    if x not in tuple(choices):
        raise ValueError(f"{owner}: {name} must be one of {', '.join(repr(c) for c in choices)}, got {x!r}")
    return x


def tensor(owner: str, name: str, x: Any, *, ndim: int | Sequence[int] | None = None,
           dtype: torch.dtype | Sequence[torch.dtype] | None = None, floating: bool = False) -> torch.Tensor:
    """A ``torch.Tensor`` with the given number of dimensions / dtype (or any floating dtype)."""
    if not isinstance(x, torch.Tensor):
        raise ArgumentTypeError(f"{owner}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None:
        dims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in dims:
            want = " or ".join(str(d) for d in dims)
            raise ValueError(f"{owner}: {name} must have {want} dimensions, got shape {tuple(x.shape)}")
    if dtype is not None:
        dts = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if x.dtype not in dts:
            want = " or ".join(map(str, dts))
            raise ArgumentTypeError(f"{owner}: {name} must have dtype {want}, got {x.dtype}")
    if floating and not x.is_floating_point():
        raise ArgumentTypeError(f"{owner}: {name} must be a floating-point tensor, got {x.dtype}")
    return x


def each(owner: str, name: str, xs: Any, rule: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """A non-empty sequence (a grid) whose every element passes ``rule`` (named ``name[i]``); returns a tuple.

    Example: ``v.each("Config", "lrs", lrs, v.positive)``; ``v.each("Config", "betas", b, v.in_range, 0.0, 1.0)``.
    """
    if isinstance(xs, (str, bytes)) or not isinstance(xs, Sequence) or len(xs) == 0:
        raise ValueError(f"{owner}: {name} must be a non-empty sequence, got {xs!r}")
    return tuple(rule(owner, f"{name}[{i}]", x, *args, **kwargs) for i, x in enumerate(xs))


def same_length(owner: str, names: Sequence[str], *sizes: int) -> int:
    """Equal leading sizes (e.g. inputs and targets); returns the common size."""
    if len(set(sizes)) > 1:
        detail = ", ".join(f"{n}={s}" for n, s in zip(names, sizes, strict=True))
        raise ValueError(f"{owner}: {' and '.join(names)} must have the same length, got {detail}")
    return sizes[0]
