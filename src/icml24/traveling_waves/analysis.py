"""Analysis of trained RNNs against the TWM theory: spectrum, spectral error, lag decoding, gradient norms.

Re-implemented from the companion code's ideas (``emt-tools``: ``spectral_comparison``; notes §3.3, §5 C-D):

- spectrum: eigenvalues of W_hh with |λ| > 0.9 vs the theory operator M's (the block companion matrix);
- spectral angular error: both lists kept at |λ| > threshold, the shorter padded with zeros (angle 0), each
  theoretical eigenvalue greedily matched to the empirical one of closest angle; mean angular distance (rad);
- lag decoding: least-squares linear decoders h(t) → x(t-k), R² on held-out sequences;
- gradient norms: ‖∂h(t)/∂x(t-k)‖_F (the memory) and ‖∂ŷ(t)/∂x(t-k)‖_F over lags k, averaged over sequences.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from icml24.common import validate as v
from icml24.traveling_waves.rnn import ElmanRNN
from icml24.traveling_waves.tasks import make_batch, task_matrix
from icml24.traveling_waves.twm import shift_operator

__all__ = ["theory_spectrum", "eigenvalues", "near_unit_count", "spectral_error", "expected_unit_count",
           "decode_lags", "linear_r2", "gradient_norms"]
_OWNER = "traveling_waves"


def theory_spectrum(*, task: str, d: int, s: int) -> np.ndarray:
    """Eigenvalues of the TWM operator M of task ``task`` (complex, length s·d)."""
    M = shift_operator(F=task_matrix(task=task, d=d, s=s), d=d, s=s)
    return np.linalg.eigvals(M.numpy())


def expected_unit_count(*, task: str, d: int, s: int) -> int:
    """Number of unit-modulus theory eigenvalues: s·d for T1, Σ_{k<d} (s-k) for T2-T4 (= s(s+1)/2 if d = s)."""
    task_matrix(task=task, d=d, s=s)  # validates
    return s * d if task == "T1" else sum(s - k for k in range(d))


def eigenvalues(W: torch.Tensor) -> np.ndarray:
    """Eigenvalues of a square matrix (computed in float64)."""
    v.tensor(_OWNER, "W", W, ndim=2)
    if W.shape[0] != W.shape[1]:
        raise ValueError(f"{_OWNER}: W must be square, got {tuple(W.shape)}")
    return np.linalg.eigvals(W.detach().cpu().double().numpy())


def near_unit_count(eigs: np.ndarray, *, threshold: float = 0.9) -> int:
    """Number of eigenvalues with |λ| > threshold (notes §3.3: 0.9)."""
    v.positive(_OWNER, "threshold", threshold)
    return int(np.sum(np.abs(np.asarray(eigs)) > threshold))


def spectral_error(theory: np.ndarray, learned: np.ndarray, *, threshold: float = 0.9) -> float:
    """Mean angular distance (rad) between the near-unit theory and learned eigenvalues (emt-tools rule).

    Keep |λ| > threshold in both lists; pad the shorter with zeros (angle 0); greedily match each theory
    eigenvalue, in order, to the remaining learned one of closest angle; average the angular distances.
    Returns ``nan`` when neither list has an eigenvalue above the threshold.
    """
    v.positive(_OWNER, "threshold", threshold)
    th = [complex(z) for z in np.asarray(theory) if abs(z) > threshold]
    le = [complex(z) for z in np.asarray(learned) if abs(z) > threshold]
    n = max(len(th), len(le))
    if n == 0:
        return float("nan")
    th += [0j] * (n - len(th))
    le += [0j] * (n - len(le))
    ang_le = [math.atan2(z.imag, z.real) for z in le]
    errors = []
    for z in th:
        a = math.atan2(z.imag, z.real)
        dist = [abs(math.remainder(a - b, 2 * math.pi)) for b in ang_le]
        j = int(np.argmin(dist))
        errors.append(dist[j])
        ang_le.pop(j)
    return float(np.mean(errors))


def linear_r2(features_train: np.ndarray, targets_train: np.ndarray, features_test: np.ndarray,
              targets_test: np.ndarray) -> float:
    """R² (pooled over target components) of a least-squares linear decoder fit on train, scored on test."""
    A = np.c_[features_train, np.ones(len(features_train))]
    coef, *_ = np.linalg.lstsq(A, targets_train, rcond=None)
    pred = np.c_[features_test, np.ones(len(features_test))] @ coef
    sse = float(np.sum((targets_test - pred) ** 2))
    sst = float(np.sum((targets_test - targets_test.mean(0)) ** 2))
    return 1.0 - sse / sst if sst > 0 else float("nan")


@torch.no_grad()
def decode_lags(model: ElmanRNN, *, s: int, delay: int = 0, n_train: int = 2048, n_test: int = 1024,
                generator: torch.Generator) -> np.ndarray:
    """R² of linear decoders from h(s-1+delay) to the inputs x(s-1-k), k = 0..s-1 (window position k).

    Inputs are s random ±1 steps then zeros (the task's protocol). ``delay = 0`` decodes at the end of the input
    phase (lag k exactly); ``delay > 0`` decodes the same window after ``delay`` zero-input steps, i.e. whether
    the window is still held (working memory) in the output phase.

    Returns:
        R² per window position k (length s), on ``n_test`` held-out sequences.
    """
    s = v.integer(_OWNER, "s", s, minimum=1)
    delay = v.integer(_OWNER, "delay", delay, minimum=0)
    v.integer(_OWNER, "n_train", n_train, minimum=2)
    v.integer(_OWNER, "n_test", n_test, minimum=2)
    p = next(model.parameters())
    # any task gives the same inputs; T1 exists for every (d, s)
    x, _ = make_batch(task="T1", d=model.d, s=s, horizon=delay + 1, batch_size=n_train + n_test,
                      generator=generator, dtype=p.dtype)
    h = model.hidden_states(x.to(p.device))[:, s - 1 + delay].double().cpu().numpy()
    xs = x.double().numpy()
    out = []
    for k in range(s):
        tgt = xs[:, s - 1 - k]
        out.append(linear_r2(h[:n_train], tgt[:n_train], h[n_train:], tgt[n_train:]))
    return np.array(out)


def gradient_norms(model: ElmanRNN, x: torch.Tensor, *, t: int, lags: int, wrt: str = "hidden") -> np.ndarray:
    """Mean over sequences of ‖∂h(t)/∂x(t-k)‖_F (``wrt="hidden"``) or ‖∂ŷ(t)/∂x(t-k)‖_F (``"output"``).

    Args:
        model: the RNN.
        x: inputs (B, T, d); the Jacobians are taken at this trajectory.
        t: the time of h(t) / ŷ(t) (0 ≤ t < T).
        lags: number of lags k = 0..lags-1 (needs lags ≤ t + 1).
        wrt: ``"hidden"`` or ``"output"``.

    Returns:
        array (lags,) of mean Frobenius norms.
    """
    v.tensor(_OWNER, "x", x, ndim=3, floating=True)
    T = x.shape[1]
    t = v.integer(_OWNER, "t", t, minimum=0, maximum=T - 1)
    lags = v.integer(_OWNER, "lags", lags, minimum=1, maximum=t + 1)
    v.one_of(_OWNER, "wrt", wrt, ("hidden", "output"))
    x = x.detach().clone().requires_grad_(True)
    h = model.hidden_states(x)[:, t]
    target = h if wrt == "hidden" else model.readout(h)
    sq = torch.zeros(x.shape[0], lags, dtype=torch.float64)
    for j in range(target.shape[1]):
        (g,) = torch.autograd.grad(target[:, j].sum(), x, retain_graph=True)  # samples are independent
        sel = g[:, t - lags + 1: t + 1].flip(1)  # lag k = t - τ
        sq += (sel.double() ** 2).sum(-1)
    return sq.sqrt().mean(0).numpy()
