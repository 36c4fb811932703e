"""History-dependent dynamical-system (HDS) tasks T1-T4 of the traveling-wave paper, and the horizon curriculum.

Karuvally, Sejnowski, Siegelmann, "Hidden Traveling Waves bind Working Memory Variables in Recurrent Neural
Networks", ICML 2024 (arXiv 2402.10163); tasks as in the authors' companion code
``arjunkaruvally/emt_variable_binding`` (``BinaryLinearVBDataset``), re-implemented.

An episode: ±1 random bits x(0..s-1) ∈ {±1}^d for the first s steps (input phase), zero input afterwards.
The target trajectory z obeys the linear HDS of window s::

    z(t) = x(t)                                   t < s
    z(t) = Fᵀ vec(z(t-s), ..., z(t-1))            t ≥ s     (window stacked oldest first)

with F ∈ {0, ±1}^{(s·d)×d}: row r·d + i of F reads component i of z(t-s+r), i.e. lag s-r.

- T1 repeat copy: z(t) = z(t-s).
- T2 diagonal lags: z_k(t) = z_k(t-s+k) (component k has lag s-k; needs d ≤ s).
- T3, T4: T2's selected history entries, permuted across output components and sign-flipped. For d = s = 8
  they are the authors' task ids (262676, 189) and (38637, 145); for other sizes a fixed rule (see
  :func:`task_matrix`).

Loss: MSE on steps t ≥ s; accuracy: sign(ŷ) == z on steps t ≥ s. Curriculum over the output horizon
(10, 20, 40, 60, 100), advancing when the training-batch accuracy exceeds 0.96; tested at horizon 200.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from icml24.common import validate as v

__all__ = ["TASKS", "task_matrix", "make_batch", "hds_targets", "Curriculum"]

TASKS: tuple[str, ...] = ("T1", "T2", "T3", "T4")
_OWNER = "traveling_waves"

# Authors' T3/T4 for d = s = 8 (decoded from BinaryLinearVBDataset): output j reads source component src[j]
# (at lag s - src[j], the T2 entry of that component) with sign sgn[j].
_PAPER_T3 = ((4, 3, 2, 0, 1, 5, 7, 6), (-1, 1, -1, -1, -1, -1, 1, -1))
_PAPER_T4 = ((5, 6, 0, 1, 2, 3, 4, 7), (-1, 1, 1, 1, -1, 1, 1, -1))


def _check_ds(d: int, s: int) -> tuple[int, int]:
    return v.integer(_OWNER, "d", d, minimum=1), v.integer(_OWNER, "s", s, minimum=1)


def task_matrix(*, task: str, d: int, s: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The task's evolution matrix F ∈ {0, ±1}^{(s·d)×d}: z(t) = Fᵀ vec(z(t-s), ..., z(t-1)).

    Args:
        task: one of ``"T1"``-``"T4"``.
        d: dimension of the variable x(t).
        s: history window (memory length).
        dtype: floating dtype of the result.

    Raises:
        ValueError: unknown task, d or s < 1, or d > s for T2-T4 (component k has lag s-k >= 1).
    """
    d, s = _check_ds(d, s)
    v.one_of(_OWNER, "task", task, TASKS)
    F = torch.zeros(s * d, d, dtype=dtype)
    if task == "T1":
        for i in range(d):
            F[i, i] = 1.0  # row 0 = oldest step (lag s), component i -> output i
        return F
    if d > s:
        raise ValueError(f"{_OWNER}: task {task} needs d <= s (component k has lag s-k), got d={d}, s={s}")
    if task == "T2":
        src, sgn = tuple(range(d)), (1,) * d
    elif d == 8 and s == 8:
        src, sgn = _PAPER_T3 if task == "T3" else _PAPER_T4
    else:
        # NOTE(deviation): the authors' T3/T4 ids are defined for d = s = 8 only; for other sizes T3 reverses
        # the components with alternating signs, T4 rotates them by one with every third sign flipped.
        if task == "T3":
            src, sgn = tuple(reversed(range(d))), tuple(-1 if j % 2 == 0 else 1 for j in range(d))
        else:
            src, sgn = tuple((j + 1) % d for j in range(d)), tuple(-1 if j % 3 == 0 else 1 for j in range(d))
    for j in range(d):
        k = src[j]
        F[k * d + k, j] = float(sgn[j])  # history row k (lag s-k), component k -> output j
    return F


def hds_targets(x: torch.Tensor, F: torch.Tensor, *, s: int) -> torch.Tensor:
    """The HDS trajectory z for inputs ``x`` (B, T, d) whose steps t ≥ s are ignored (output phase).

    Direct recursion z(t) = Fᵀ vec(z(t-s..t-1)) for t ≥ s, z(t) = x(t) for t < s.
    """
    v.tensor(_OWNER, "x", x, ndim=3, floating=True)
    s = v.integer(_OWNER, "s", s, minimum=1)
    B, T, d = x.shape
    if T < s:
        raise ValueError(f"{_OWNER}: sequence length T={T} is shorter than the memory window s={s}")
    if F.shape != (s * d, d):
        raise ValueError(f"{_OWNER}: F must have shape ({s * d}, {d}), got {tuple(F.shape)}")
    z = torch.zeros_like(x)
    z[:, :s] = x[:, :s]
    Ft = F.to(x.dtype)
    for t in range(s, T):
        z[:, t] = z[:, t - s:t].reshape(B, s * d) @ Ft
    return z


def make_batch(*, task: str, d: int, s: int, horizon: int, batch_size: int, generator: torch.Generator,
               dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch: inputs (B, s + horizon, d) with ±1 bits in the first s steps, and HDS targets z.

    Args:
        task: ``"T1"``-``"T4"``.
        d, s: variable dimension and memory window.
        horizon: number of output steps after the input phase.
        batch_size: B.
        generator: the source of the bits.
        dtype: dtype of the tensors.
    """
    F = task_matrix(task=task, d=d, s=s, dtype=dtype)
    horizon = v.integer(_OWNER, "horizon", horizon, minimum=1)
    batch_size = v.integer(_OWNER, "batch_size", batch_size, minimum=1)
    bits = torch.randint(0, 2, (batch_size, s, d), generator=generator).to(dtype) * 2 - 1
    x = torch.zeros(batch_size, s + horizon, d, dtype=dtype)
    x[:, :s] = bits
    return x, hds_targets(x, F, s=s)


@dataclass
class Curriculum:
    """Output-horizon curriculum: advance to the next horizon when the training-batch accuracy > threshold.

    Attributes:
        horizons: increasing output horizons (paper code: 10, 20, 40, 60, 100).
        threshold: accuracy that advances the curriculum (paper code default 0.96).
    """

    horizons: tuple[int, ...] = (10, 20, 40, 60, 100)
    threshold: float = 0.96
    stage: int = 0

    def __post_init__(self) -> None:
        if not self.horizons or any(v.integer(_OWNER, "horizons", h, minimum=1) < 1 for h in self.horizons):
            raise ValueError(f"{_OWNER}: horizons must be a non-empty tuple of ints >= 1, got {self.horizons!r}")
        if list(self.horizons) != sorted(set(self.horizons)):
            raise ValueError(f"{_OWNER}: horizons must be strictly increasing, got {self.horizons!r}")
        v.probability(_OWNER, "threshold", self.threshold)

    @property
    def horizon(self) -> int:
        return self.horizons[self.stage]

    @property
    def done(self) -> bool:
        """True at the last stage."""
        return self.stage == len(self.horizons) - 1

    def update(self, accuracy: float) -> bool:
        """Record a training-batch accuracy; returns True when the curriculum advanced."""
        if accuracy > self.threshold and not self.done:
            self.stage += 1
            return True
        return False
