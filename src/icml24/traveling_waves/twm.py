"""Traveling Wave Memory (TWM): a shift substrate whose start boundary computes the history dependence.

Karuvally, Sejnowski, Siegelmann, "Hidden Traveling Waves bind Working Memory Variables in Recurrent Neural
Networks", ICML 2024, arXiv 2402.10163. Official code: none published (companion code read:
``arjunkaruvally/emt_variable_binding``, ``arjunkaruvally/emt-tools``).

Substrate h ∈ R^{s×d}, rows stacked oldest first (row s-1 = start boundary = newest). One step::

    h_i(t+1)     = h_{i+1}(t)                  0 ≤ i < s-1   (the wave travels toward row 0 and leaves)
    h_{s-1}(t+1) = f(h(t)) + u(t+1)             start boundary; u = input written during the input phase

Linear boundary (LBC): f(h) = Σ_i Φ_i h_i = Fᵀ vec(h) ⇒ vec(h)(t+1) = M vec(h)(t), M = block shift + one block
row of Φ's (block companion matrix); in any basis Ψ, W_hh = Ψ M Ψ⁻¹ has the same spectrum.
Self-attention boundary (SBC): f(h) = Σ_i softmax_i(c · h_iᵀ K Q h_{s-1}) V h_i, the autoregressive loop of a
one-layer attention-only transformer whose context window (s tokens) is the substrate.

NOTE(deviation): the paper writes waves travelling s → 1 with the boundary at row s; the blog writes the
mirror image. This module stacks rows oldest first (as emt-tools' Φ), so the boundary is row s-1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from icml24.common import validate as v

__all__ = ["LinearBoundary", "AttentionBoundary", "TravelingWaveMemory", "hds_recursion", "shift_operator",
           "LinearWaveRNN", "linear_wave_rnn"]
_OWNER = "traveling_waves"


def _check_substrate(h: torch.Tensor, d: int, s: int, name: str = "h") -> None:
    v.tensor(_OWNER, name, h, floating=True)
    if h.dim() < 2 or tuple(h.shape[-2:]) != (s, d):
        raise ValueError(f"{_OWNER}: {name} must end in the substrate shape (s, d) = ({s}, {d}), "
                         f"got {tuple(h.shape)}")


class LinearBoundary:
    """Linear boundary condition f(h) = Fᵀ vec(h) = Σ_i Φ_i h_i, Φ_i = F[i·d:(i+1)·d]ᵀ.

    Args:
        F: (s·d, d) evolution matrix; row r·d + j reads component j of substrate row r (lag s - r).
        d: variable dimension.
        s: window (substrate length).
    """

    def __init__(self, *, F: torch.Tensor, d: int, s: int) -> None:
        self.d = v.integer(_OWNER, "d", d, minimum=1)
        self.s = v.integer(_OWNER, "s", s, minimum=1)
        v.tensor(_OWNER, "F", F, ndim=2, floating=True)
        if tuple(F.shape) != (s * d, d):
            raise ValueError(f"{_OWNER}: F must have shape (s*d, d) = ({s * d}, {d}), got {tuple(F.shape)}")
        self.F = F

    @property
    def phi(self) -> torch.Tensor:
        """Φ stacked as (s, d, d): f(h) = Σ_i Φ_i h_i."""
        return self.F.reshape(self.s, self.d, self.d).transpose(1, 2)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        _check_substrate(h, self.d, self.s)
        return h.reshape(*h.shape[:-2], self.s * self.d) @ self.F.to(h.dtype)

    def transition_matrix(self) -> torch.Tensor:
        """M ∈ R^{sd×sd} with vec(h)(t+1) = M vec(h)(t): block shift plus the last block row Fᵀ."""
        return shift_operator(F=self.F, d=self.d, s=self.s)


def shift_operator(*, F: torch.Tensor, d: int, s: int) -> torch.Tensor:
    """The theoretical TWM operator M (block companion matrix) of a linear HDS with evolution matrix F.

    Rows/columns are the substrate entries stacked oldest first; M[i·d + j, (i+1)·d + j] = 1 for i < s-1
    (the shift) and M[(s-1)·d:, :] = Fᵀ (the boundary). Its eigenvalues are the theory spectrum.
    """
    d = v.integer(_OWNER, "d", d, minimum=1)
    s = v.integer(_OWNER, "s", s, minimum=1)
    if tuple(F.shape) != (s * d, d):
        raise ValueError(f"{_OWNER}: F must have shape (s*d, d) = ({s * d}, {d}), got {tuple(F.shape)}")
    M = torch.zeros(s * d, s * d, dtype=F.dtype)
    M[: (s - 1) * d, d:] = torch.eye((s - 1) * d, dtype=F.dtype)
    M[(s - 1) * d:, :] = F.T
    return M


class AttentionBoundary:
    """Self-attention boundary condition f(h) = Σ_i softmax_i(c · h_iᵀ K Q h_{s-1}) V h_i.

    With a transformer's projections W_Q, W_K, W_V (scores (W_K h_i)·(W_Q h_{s-1}) / √d): K = W_Kᵀ, Q = W_Q,
    V = W_V, c = 1/√d.

    Args:
        K, Q, V: (d, d) matrices.
        scale: c, the score scale.
    """

    def __init__(self, *, K: torch.Tensor, Q: torch.Tensor, V: torch.Tensor, scale: float = 1.0) -> None:
        for name, m in (("K", K), ("Q", Q), ("V", V)):
            v.tensor(_OWNER, name, m, ndim=2, floating=True)
            if m.shape[0] != m.shape[1] or m.shape != K.shape:
                raise ValueError(f"{_OWNER}: K, Q, V must be square (d, d) of one size, got {name} "
                                 f"{tuple(m.shape)} and K {tuple(K.shape)}")
        self.K, self.Q, self.V = K, Q, V
        self.scale = v.finite(_OWNER, "scale", scale)
        self.d = K.shape[0]

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if h.dim() < 2 or h.shape[-1] != self.d:
            raise ValueError(f"{_OWNER}: h must have shape (..., s, {self.d}), got {tuple(h.shape)}")
        q = h[..., -1, :] @ (self.K @ self.Q).T.to(h.dtype)          # (..., d): K Q h_{s-1}
        scores = self.scale * torch.einsum("...id,...d->...i", h, q)  # h_iᵀ K Q h_{s-1}
        a = torch.softmax(scores, dim=-1)
        return torch.einsum("...i,...id->...d", a, h @ self.V.T.to(h.dtype))


class TravelingWaveMemory:
    """The TWM: an s×d shift substrate with a boundary condition f (linear, attention, or any callable).

    Args:
        d: variable dimension (number of independent 1-D waves).
        s: substrate length (history window).
        boundary: f, mapping a substrate (..., s, d) to the new start-boundary row (..., d).
    """

    def __init__(self, *, d: int, s: int, boundary: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.d = v.integer(_OWNER, "d", d, minimum=1)
        self.s = v.integer(_OWNER, "s", s, minimum=1)
        if not callable(boundary):
            raise TypeError(f"{_OWNER}: boundary must be callable, got {type(boundary).__name__}")
        self.boundary = boundary

    def step(self, h: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
        """One step: shift every row toward row 0, write f(h) (+ input u) into the start boundary."""
        _check_substrate(h, self.d, self.s)
        new = self.boundary(h)
        if u is not None:
            new = new + u
        return torch.cat([h[..., 1:, :], new[..., None, :]], dim=-2)

    def rollout(self, *, window: torch.Tensor, steps: int) -> torch.Tensor:
        """Initialise the substrate with x(0..s-1) (``window``, (..., s, d)) and return x(s..s+steps-1).

        The output at each step is the start-boundary row (the readout), so this is Theorem 3.1's
        representation of the HDS x(t) = f(x(t-s), ..., x(t-1)).
        """
        _check_substrate(window, self.d, self.s, "window")
        steps = v.integer(_OWNER, "steps", steps, minimum=1)
        h, out = window, []
        for _ in range(steps):
            h = self.step(h)
            out.append(h[..., -1, :])
        return torch.stack(out, dim=-2)

    def run_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Drive the substrate from zero with inputs x (..., T, d); returns the start-boundary row at each step.

        Input phase (t < s): x(t) is written into the start boundary (it replaces f(h)); afterwards the boundary
        is f(h) + x(t). So with zero input after s steps this returns the task trajectory z of :mod:`.tasks`.
        """
        v.tensor(_OWNER, "x", x, floating=True)
        if x.dim() < 2 or x.shape[-1] != self.d:
            raise ValueError(f"{_OWNER}: x must have shape (..., T, {self.d}), got {tuple(x.shape)}")
        if x.shape[-2] < self.s:
            raise ValueError(f"{_OWNER}: sequence length T={x.shape[-2]} is shorter than the memory window "
                             f"s={self.s}")
        h = torch.zeros(*x.shape[:-2], self.s, self.d, dtype=x.dtype)
        out = []
        for t in range(x.shape[-2]):
            if t < self.s:
                h = torch.cat([h[..., 1:, :], x[..., t, None, :]], dim=-2)
            else:
                h = self.step(h, x[..., t, :])
            out.append(h[..., -1, :])
        return torch.stack(out, dim=-2)


def hds_recursion(*, f: Callable[[torch.Tensor], torch.Tensor], window: torch.Tensor, steps: int) -> torch.Tensor:
    """Direct recursion x(t) = f(x(t-s), ..., x(t-1)) from x(0..s-1) = ``window`` (..., s, d), no substrate.

    Returns x(s..s+steps-1), shape (..., steps, d).
    """
    v.tensor(_OWNER, "window", window, floating=True)
    if window.dim() < 2:
        raise ValueError(f"{_OWNER}: window must have shape (..., s, d), got {tuple(window.shape)}")
    steps = v.integer(_OWNER, "steps", steps, minimum=1)
    s = window.shape[-2]
    xs = list(window.unbind(-2))
    for _ in range(steps):
        xs.append(f(torch.stack(xs[-s:], dim=-2)))
    return torch.stack(xs[s:], dim=-2)


@dataclass
class LinearWaveRNN:
    """A linear RNN h(t) = W_hh h(t-1) + W_uh x(t), y(t) = W_r h(t) that implements a TWM in basis Ψ."""

    W_hh: torch.Tensor
    W_uh: torch.Tensor
    W_r: torch.Tensor

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """Outputs y(0..T-1) for inputs x (..., T, d), from h(-1) = 0."""
        h = torch.zeros(*x.shape[:-2], self.W_hh.shape[0], dtype=x.dtype)
        out = []
        for t in range(x.shape[-2]):
            h = h @ self.W_hh.T + x[..., t, :] @ self.W_uh.T
            out.append(h @ self.W_r.T)
        return torch.stack(out, dim=-2)


def linear_wave_rnn(*, F: torch.Tensor, d: int, s: int, basis: torch.Tensor | None = None) -> LinearWaveRNN:
    """The LBC TWM as a linear RNN in basis Ψ: W_hh = Ψ M Ψ⁻¹, W_uh = Ψ E, W_r = Eᵀ Ψ⁻¹ (E: start row).

    Args:
        F: (s·d, d) evolution matrix.
        d, s: variable dimension and window.
        basis: invertible Ψ ∈ R^{sd×sd} (default identity: the substrate coordinates).
    """
    M = shift_operator(F=F, d=d, s=s)
    n = s * d
    if basis is None:
        basis = torch.eye(n, dtype=F.dtype)
    v.tensor(_OWNER, "basis", basis, ndim=2, floating=True)
    if tuple(basis.shape) != (n, n):
        raise ValueError(f"{_OWNER}: basis must be ({n}, {n}), got {tuple(basis.shape)}")
    inv = torch.linalg.inv(basis)
    E = torch.zeros(n, d, dtype=F.dtype)
    E[(s - 1) * d:] = torch.eye(d, dtype=F.dtype)
    return LinearWaveRNN(W_hh=basis @ M @ inv, W_uh=basis @ E, W_r=E.T @ inv)
