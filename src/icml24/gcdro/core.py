"""Geometry-Calibrated DRO: Combating Over-Pessimism with Free Energy Implications (Liu, Wu, Wang, Zou, Li,
Cui; ICML 2024). arXiv 2311.05054. Official code: none published.

Worst-case distribution q over the n training points, calibrated by the data geometry (kNN graph, Laplacian L):

    R(θ) = sup_{q ∈ Δ_n, GW_G(q, p̂) <= ρ}  Σ_i q_i ℓ_i(θ) − α·n·qᵀLq + β·H(q),      H(q) = −Σ_i q_i log q_i
         = −inf_q F(q),   F(q) = U(q) − β·S(q)  (Helmholtz free energy, temperature β)
    Φ_i(q) = ∂F/∂q_i = −ℓ_i + 2·α·n·(Lq)_i + β·(log q_i + 1)                      (chemical potential)
    dq_i/dt = Σ_j w_ij [(Φ_j − Φ_i)_+ q_j − (Φ_i − Φ_j)_+ q_i]        (upwind Wasserstein gradient flow on G)

The radius ρ of the geometric Wasserstein ball is realised as the time horizon of the flow started at p̂.
This module is the functional core (graph, objective, flow, closed-form DRO best responses); no I/O.

NOTE(deviation): the paper body was not available; the objective above, the Gaussian kNN weights, the
``α·n`` (u = n·q) scaling and the adaptive step are reconstructions from the abstract, the authors' GDRO
paper (NeurIPS 2022) and Chow et al. (ARMA 2012). See README "Deviations".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import connected_components
from scipy.sparse.csgraph import laplacian as _csgraph_laplacian
from sklearn.neighbors import kneighbors_graph

from icml24.common import validate as v

__all__ = [
    "EdgeList",
    "knn_graph",
    "knn_edges",
    "graph_laplacian",
    "laplacian_apply",
    "dirichlet_energy",
    "gcdro_objective",
    "chemical_potential",
    "upwind_flux",
    "adaptive_step",
    "gradient_flow",
    "erm_weights",
    "kl_worst_case",
    "chi2_worst_case",
    "cvar_worst_case",
    "kl_constrained_worst_case",
    "chi2_constrained_worst_case",
    "tv_from_uniform",
]

_EPS = 1e-12
KL_MIN_TEMPERATURE = 1e-6  # smallest KL temperature λ accepted (smaller ones overflow ℓ/λ)


def _check_finite_array(name: str, a: np.ndarray) -> None:
    if not np.all(np.isfinite(a)):
        raise ValueError(f"gcdro: {name} contains NaN or inf")


def check_graph_params(n: int, *, n_neighbors: int, sigma: float | None) -> None:
    """k in [1, n - 1] and σ > 0 (or None): the kNN-graph parameters shared by knn_graph and GCDRORegressor."""
    v.integer("gcdro", "n_neighbors", n_neighbors, minimum=1, maximum=n - 1)
    if sigma is not None:
        v.positive("gcdro", "sigma", sigma)


# ----------------------------------------------------------------------------------------------- graph
def knn_graph(x: np.ndarray, *, n_neighbors: int = 10, sigma: float | None = None,
              ensure_connected: bool = True) -> sp.csr_matrix:
    """Symmetric Gaussian-weighted k-nearest-neighbour graph W (the data geometry G = (V, E, W)).

    ``w_ij = exp(−‖x_i − x_j‖² / 2σ²)`` on the kNN edges, symmetrised as ``W = max(W, Wᵀ)``.

    Args:
        x: ``(n, d)`` node features (standardise them first; the estimator does).
        n_neighbors: k of the kNN graph, ``1 <= k < n``.
        sigma: Gaussian bandwidth σ; ``None`` uses the median kNN distance.
        ensure_connected: if the graph has several components, double k until it is connected
            (the flow can only move mass along edges, so a disconnected graph freezes the mass of each part).

    Returns:
        ``(n, n)`` symmetric ``scipy.sparse.csr_matrix`` with zero diagonal.

    NOTE(deviation): the paper's edge weighting is unknown; Gaussian weights with the median bandwidth are ours.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"gcdro: x must be 2-D (n, d), got shape {x.shape}")
    n = x.shape[0]
    check_graph_params(n, n_neighbors=n_neighbors, sigma=sigma)
    _check_finite_array("x", x)
    k = int(n_neighbors)
    while True:
        dist = kneighbors_graph(x, n_neighbors=k, mode="distance", include_self=False).tocsr()
        # Gaussian weights BEFORE symmetrising: identical rows have distance 0, which a sparse max(W, Wᵀ)
        # would drop as an explicit zero; their weight exp(0) = 1 must stay an edge.
        if sigma is None:  # median kNN distance of the symmetrised graph (zeros of duplicate rows excluded)
            d_sym = dist.maximum(dist.T).data
            s = float(np.median(d_sym)) if d_sym.size else 1.0
        else:
            s = float(sigma)
        s = s if s > 0 else 1.0
        w = dist.copy()
        # floor keeps far (fallback) edges from underflowing to 0, which would disconnect the graph again
        w.data = np.maximum(np.exp(-(w.data ** 2) / (2.0 * s * s)), 1e-12)
        w = w.maximum(w.T).tocsr()  # symmetrise: i ~ j if either is a kNN of the other
        w.setdiag(0.0)
        w.eliminate_zeros()
        n_comp, _ = connected_components(w, directed=False)
        if n_comp == 1 or not ensure_connected or k >= n - 1:
            break
        k = min(2 * k, n - 1)
    return w.tocsr()


def _components_torch(nbr: torch.Tensor, w: torch.Tensor) -> int:
    """Number of connected components of a padded neighbour table (label propagation + pointer jumping)."""
    n = nbr.shape[0]
    nb = torch.where(w > 0, nbr, torch.arange(n, device=nbr.device).unsqueeze(1))
    lab = torch.arange(n, device=nbr.device)
    while True:
        new = torch.minimum(lab, lab[nb].amin(1))
        new = new[new]  # pointer jumping: labels are node ids, follow them
        if torch.equal(new, lab):
            return int((lab == torch.arange(n, device=nbr.device)).sum())
        lab = new


def knn_edges(x: torch.Tensor, *, n_neighbors: int = 10, sigma: float | None = None,
              ensure_connected: bool = True, dtype: torch.dtype = torch.float64) -> EdgeList:
    """The graph of :func:`knn_graph`, built in torch on ``x``'s device (pairwise distances + ``topk``).

    Same neighbours (ties aside: among equidistant candidates the chosen one may differ), same Gaussian weights
    ``max(exp(−d²/2σ²), 1e-12)``, same median bandwidth and symmetrisation ``W = max(W, Wᵀ)``, same doubling of
    k until the graph is connected; returns ``EdgeList.from_adjacency(knn_graph(x))`` without leaving the device
    (an ``(n, n)`` distance matrix: meant for minibatches, see :class:`~icml24.gcdro.GCDROWeighter`).

    Args:
        x: ``(n, d)`` floating node features (standardise them first).
        n_neighbors: k, ``1 <= k < n``.
        sigma: Gaussian bandwidth σ; ``None`` uses the median kNN distance.
        ensure_connected: double k until the graph is connected.
        dtype: floating dtype of the distances and weights.
    """
    v.tensor("gcdro", "x", x, ndim=2, floating=True)
    n = x.shape[0]
    check_graph_params(n, n_neighbors=n_neighbors, sigma=sigma)
    if not torch.isfinite(x).all():
        raise ValueError("gcdro: x contains NaN or inf")
    z = x.detach().to(dtype)
    dev = z.device
    ar = torch.arange(n, device=dev)
    sq = (z * z).sum(1)
    d_all = torch.addmm(sq.unsqueeze(1) + sq.unsqueeze(0), z, z.T, alpha=-2.0)  # squared distances (order only)
    d_all[ar, ar] = float("inf")  # include_self=False (a duplicate row is still a neighbour, at distance 0)
    k = int(n_neighbors)
    while True:
        idx = torch.topk(d_all, k, dim=1, largest=False).indices  # (n, k), nearest first
        # the union of the kNN edges seen from both ends (W = max(W, Wᵀ)), as sorted unique keys i·n + j
        rows = ar.repeat_interleave(k)
        cols = idx.reshape(-1)
        key = torch.unique(torch.cat([rows * n + cols, cols * n + rows]))  # sorted by (row, col)
        src = key // n
        dst = key - src * n
        # exact distances of the edges (the matmul form above is off by rounding; it only ranks)
        dist = (z[src] - z[dst]).norm(dim=-1)
        if sigma is None:  # median over the symmetrised graph's stored entries, zeros (duplicates) excluded
            vals = dist[dist > 0]
            s = float(torch.quantile(vals, 0.5)) if vals.numel() else 1.0
        else:
            s = float(sigma)
        s = s if s > 0 else 1.0
        wv = torch.exp(-(dist ** 2) / (2.0 * s * s)).clamp_min(1e-12)
        # padded neighbour table, neighbours in increasing index order (as EdgeList.from_adjacency)
        counts = torch.bincount(src, minlength=n)
        kmax = max(int(counts.max()), 1)
        slot = torch.arange(key.numel(), device=dev) - (torch.cumsum(counts, 0) - counts)[src]
        nbr = ar.unsqueeze(1).repeat(1, kmax)
        w = torch.zeros(n, kmax, dtype=dtype, device=dev)
        nbr[src, slot] = dst
        w[src, slot] = wv
        if not ensure_connected or k >= n - 1 or _components_torch(nbr, w) == 1:
            break
        k = min(2 * k, n - 1)
    return EdgeList(nbr, w, n, w.sum(1))


def graph_laplacian(w: sp.spmatrix) -> sp.csr_matrix:
    """Combinatorial graph Laplacian ``L = D − W`` (scipy.sparse.csgraph.laplacian)."""
    return sp.csr_matrix(_csgraph_laplacian(sp.csr_matrix(w), normed=False))


@dataclass(frozen=True)
class EdgeList:
    """The graph on one torch device, as a padded neighbour table (each undirected edge seen from both ends).

    ``nbr[i, m]`` is the m-th neighbour j of node i and ``w[i, m] = w_ij`` (padding: ``nbr = i``, ``w = 0``), so a
    sum over neighbours is a row sum (no scatter). ``src``/``dst``/``weight`` give the same directed edges as flat
    tensors (each undirected edge twice).
    """

    nbr: torch.Tensor
    w: torch.Tensor
    n: int
    degree: torch.Tensor  # d_i = Σ_j w_ij

    @property
    def src(self) -> torch.Tensor:
        return torch.arange(self.n, device=self.nbr.device).unsqueeze(1).expand_as(self.nbr)[self.w > 0]

    @property
    def dst(self) -> torch.Tensor:
        return self.nbr[self.w > 0]

    @property
    def weight(self) -> torch.Tensor:
        return self.w[self.w > 0]

    @classmethod
    def from_adjacency(cls, w: sp.spmatrix | np.ndarray, *, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float64) -> EdgeList:
        """Build from a symmetric (sparse or dense) weight matrix W with w_ij >= 0."""
        coo = sp.coo_matrix(w)
        if coo.shape[0] != coo.shape[1]:
            raise ValueError(f"gcdro: adjacency must be square, got {coo.shape}")
        if coo.nnz and (coo.data.min() < 0 or not np.all(np.isfinite(coo.data))):
            raise ValueError("gcdro: adjacency weights must be finite and >= 0")
        if abs(coo - coo.T).sum() > 1e-9 * max(1.0, abs(coo).sum()):
            raise ValueError("gcdro: adjacency must be symmetric")
        n = int(coo.shape[0])
        keep = (coo.row != coo.col) & (coo.data > 0)
        row, col, val = coo.row[keep], coo.col[keep], coo.data[keep].astype(np.float64)
        order = np.lexsort((col, row))
        row, col, val = row[order], col[order], val[order]
        counts = np.bincount(row, minlength=n)
        k = max(int(counts.max()) if counts.size else 0, 1)
        slot = np.arange(row.size) - np.repeat(np.cumsum(counts) - counts, counts)
        nbr = np.repeat(np.arange(n)[:, None], k, axis=1)
        wp = np.zeros((n, k))
        nbr[row, slot], wp[row, slot] = col, val
        nbr_t = torch.as_tensor(nbr, dtype=torch.long, device=device)
        w_t = torch.as_tensor(wp, dtype=dtype, device=device)
        return cls(nbr_t, w_t, n, w_t.sum(1))


def _gather(v: torch.Tensor, edges: EdgeList) -> torch.Tensor:
    """``v[nbr]`` as an ``(n, K)`` table."""
    return v.index_select(0, edges.nbr.reshape(-1)).reshape(edges.nbr.shape)


def laplacian_apply(q: torch.Tensor, edges: EdgeList) -> torch.Tensor:
    """``(L q)_i = Σ_j w_ij (q_i − q_j)``."""
    return edges.degree * q - (edges.w * _gather(q, edges)).sum(1)


def dirichlet_energy(q: torch.Tensor, edges: EdgeList) -> torch.Tensor:
    """``qᵀ L q = ½ Σ_ij w_ij (q_i − q_j)²`` (sum over both directions of each edge, halved)."""
    return 0.5 * (edges.w * (q.unsqueeze(1) - _gather(q, edges)) ** 2).sum()


def gcdro_objective(q: torch.Tensor, losses: torch.Tensor, edges: EdgeList, *, alpha: float,
                    beta: float) -> torch.Tensor:
    """The calibrated risk of q: ``Σ q_i ℓ_i − α·n·qᵀLq + β·H(q)`` (= −F(q); the flow maximises it)."""
    n = q.numel()
    ent = -(q * torch.log(q.clamp_min(_EPS))).sum()
    return (q * losses).sum() - alpha * n * dirichlet_energy(q, edges) + beta * ent


def chemical_potential(q: torch.Tensor, losses: torch.Tensor, edges: EdgeList, *, alpha: float,
                       beta: float) -> torch.Tensor:
    """``Φ_i = −ℓ_i + 2·α·n·(Lq)_i + β·(log q_i + 1)``, the first variation of the free energy F."""
    n = q.numel()
    phi = -losses
    if alpha:
        phi = phi + 2.0 * alpha * n * laplacian_apply(q, edges)
    if beta:
        phi = phi + beta * (torch.log(q.clamp_min(_EPS)) + 1.0)
    return phi


def upwind_flux(q: torch.Tensor, phi: torch.Tensor, edges: EdgeList) -> torch.Tensor:
    """Net inflow ``dq_i/dt = Σ_j w_ij [(Φ_j − Φ_i)_+ q_j − (Φ_i − Φ_j)_+ q_i]`` (sums to zero)."""
    d = _gather(phi, edges) - phi.unsqueeze(1)  # Φ_j − Φ_i
    return (edges.w * (torch.relu(d) * _gather(q, edges) - torch.relu(-d) * q.unsqueeze(1))).sum(1)


def adaptive_step(phi: torch.Tensor, edges: EdgeList, *, step_scale: float, q: torch.Tensor | None = None,
                  alpha: float = 0.0, beta: float = 0.0) -> torch.Tensor:
    """Adaptive Euler step ``τ = c / max(rate, diffusion, entropy)``.

    ``rate = max_i Σ_j w_ij |Φ_j − Φ_i|``: with c < 1 every step keeps q > 0. When ``q`` is given, also the
    explicit-Euler (Gershgorin) limits of the two q-dependent parts of Φ, without which large α or β make the
    iterates oscillate:

    * Dirichlet part (a graph diffusion with coefficient 2αn·q), α > 0:
      ``diffusion = 2αn · max_i Σ_j w_ij max(q_i, q_j) (d_i + d_j)``;
    * entropy part (∂Φ_i/∂q_i = β/q_i), β > 0: ``entropy = 2β · max_i Σ_j w_ij (1 + |log(q_i/q_j)|)``, the
      Jacobian's diagonal near uniform q. NOTE(deviation): the full diagonal also has a ``q_j/q_i`` term, left out
      because it stalls the flow once q spans orders of magnitude (near a Gibbs state); runs that must converge
      there pass ``max_step``.

    Returns ``inf`` when every bound is zero (Φ constant on every edge: an equilibrium).
    """
    rate = (edges.w * (_gather(phi, edges) - phi.unsqueeze(1)).abs()).sum(1).max()
    if q is not None and (alpha or beta):
        qn = _gather(q, edges)
        qi = q.unsqueeze(1)
        if alpha:
            deg = edges.degree
            diff = edges.w * torch.maximum(qi, qn) * (deg.unsqueeze(1) + _gather(deg, edges))
            rate = torch.maximum(rate, diff.sum(1).max() * (2.0 * alpha * q.numel()))
        if beta:
            qi_c, qn_c = qi.clamp_min(_EPS), qn.clamp_min(_EPS)
            stiff = 1.0 + torch.log(qi_c / qn_c).abs()
            rate = torch.maximum(rate, (edges.w * stiff).sum(1).max() * (2.0 * beta))
    return step_scale / rate if rate > 0 else torch.full_like(rate, float("inf"))


def gradient_flow(losses: torch.Tensor, edges: EdgeList, *, alpha: float = 1.0, beta: float = 0.1,
                  n_steps: int = 10, step_scale: float = 0.5, q0: torch.Tensor | None = None,
                  max_step: float | None = None, return_trace: bool = False
                  ) -> torch.Tensor | tuple[torch.Tensor, list[float]]:
    """Approximate worst case of the GCDRO risk by the Wasserstein gradient flow of F on the graph.

    Explicit Euler steps ``q ← q + τ_s · flux(q)`` with the adaptive step of :func:`adaptive_step`, started at
    ``q0`` (default p̂ = uniform). α = β = 0 is the GDRO flow (NeurIPS 2022); α = 0, β > 0 has the KL-DRO
    best response ``softmax(ℓ/β)`` as its unique equilibrium on a connected graph.

    Args:
        losses: ``(n,)`` per-sample losses ℓ_i (detached; any device — everything stays on it).
        edges: the graph (:class:`EdgeList`) on the same device.
        alpha: α >= 0, weight of the Dirichlet calibration term (in units of u = n·q).
        beta: β >= 0, entropy weight (temperature of the free energy).
        n_steps: T_in, number of Euler steps (with the step size, this sets the flow time ↔ radius ρ).
        step_scale: c in (0, 1), safety factor of the adaptive step.
        q0: start distribution (default uniform 1/n).
        max_step: optional cap on τ (bounds the flow time by ``n_steps·max_step``).
        return_trace: also return the objective value after each step.

    Returns:
        q: ``(n,)`` probability vector (and the trace when asked).
    """
    if losses.ndim != 1 or losses.numel() != edges.n:
        raise ValueError(f"gcdro: losses must have shape ({edges.n},), got {tuple(losses.shape)}")
    v.non_negative("gcdro", "alpha", alpha)
    v.non_negative("gcdro", "beta", beta)
    v.integer("gcdro", "n_steps", n_steps, minimum=0)
    v.probability("gcdro", "step_scale", step_scale, open_low=True, open_high=True)
    if max_step is not None:
        v.positive("gcdro", "max_step", max_step)
    if not torch.isfinite(losses).all():
        raise ValueError("gcdro: losses contain NaN or inf")
    losses = losses.detach().to(device=edges.weight.device, dtype=edges.weight.dtype)
    n = edges.n
    q = torch.full((n,), 1.0 / n, dtype=losses.dtype, device=losses.device) if q0 is None else \
        q0.detach().to(device=losses.device, dtype=losses.dtype).clone()
    if q.shape != (n,) or (q < 0).any() or abs(float(q.sum()) - 1.0) > 1e-6:
        raise ValueError("gcdro: q0 must be a probability vector of length n")
    trace: list[float] = []
    for _ in range(n_steps):
        phi = chemical_potential(q, losses, edges, alpha=alpha, beta=beta)
        tau = adaptive_step(phi, edges, step_scale=step_scale, q=q, alpha=alpha, beta=beta)
        if not torch.isfinite(tau):
            break  # equilibrium reached
        if max_step is not None:
            tau = tau.clamp(max=max_step)
        q = q + tau * upwind_flux(q, phi, edges)
        q = q.clamp_min(_EPS)  # safeguard only: c < 1 already keeps q > 0 and the flux conserves mass
        q = q / q.sum()
        if return_trace:
            trace.append(float(gcdro_objective(q, losses, edges, alpha=alpha, beta=beta)))
    return (q, trace) if return_trace else q


# ---------------------------------------------------------------------- closed-form DRO best responses
def _check_losses(losses: torch.Tensor) -> None:
    if losses.ndim != 1 or losses.numel() == 0:
        raise ValueError(f"gcdro: losses must be a non-empty 1-D tensor, got shape {tuple(losses.shape)}")
    if not torch.isfinite(losses).all():
        raise ValueError("gcdro: losses contain NaN or inf")


def erm_weights(losses: torch.Tensor) -> torch.Tensor:
    """p̂ = uniform 1/n (empirical risk minimisation)."""
    _check_losses(losses)
    return torch.full_like(losses, 1.0 / losses.numel())


def kl_worst_case(losses: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """KL-penalised DRO best response ``q_i ∝ exp(ℓ_i / λ)`` (exponential tilting), λ = ``temperature`` >= 1e-6."""
    _check_losses(losses)
    # ℓ/λ overflows to inf for λ ~ 1e-310 and the softmax returns NaN
    v.at_least("gcdro", "temperature", temperature, KL_MIN_TEMPERATURE)
    return torch.softmax(losses / temperature, dim=0)


def _project_simplex(v: torch.Tensor) -> torch.Tensor:
    """Euclidean projection onto the probability simplex (sort-based, exact)."""
    u, _ = torch.sort(v, descending=True)
    css = torch.cumsum(u, 0) - 1.0
    k = torch.arange(1, v.numel() + 1, device=v.device, dtype=v.dtype)
    rho = int(torch.nonzero(u - css / k > 0).max())
    theta = css[rho] / (rho + 1)
    return torch.clamp(v - theta, min=0.0)


def chi2_worst_case(losses: torch.Tensor, *, lam: float) -> torch.Tensor:
    """χ²-penalised DRO best response: ``argmax_q ⟨q, ℓ⟩ − (λ/2n)‖n q − 1‖²`` = ``(ℓ_i − η)_+ / (λ n)``.

    Computed exactly as the simplex projection of ``1/n + ℓ/(λ n)`` (η is the projection's threshold).
    """
    _check_losses(losses)
    v.positive("gcdro", "lam", lam)
    n = losses.numel()
    return _project_simplex(1.0 / n + losses / (lam * n))


def cvar_worst_case(losses: torch.Tensor, *, alpha: float) -> torch.Tensor:
    """CVaR_α best response: mass ``1/(α n)`` on the largest losses until the total is 1 (fractional last)."""
    _check_losses(losses)
    v.probability("gcdro", "alpha (CVaR level)", alpha, open_low=True)
    n = losses.numel()
    cap = 1.0 / (alpha * n)
    order = torch.argsort(losses, descending=True)
    filled = torch.arange(n, device=losses.device, dtype=losses.dtype) * cap  # mass before each sorted slot
    w_sorted = torch.clamp(1.0 - filled, min=0.0, max=cap)
    return torch.zeros_like(losses).scatter_(0, order, w_sorted)


def kl_constrained_worst_case(losses: torch.Tensor, *, radius: float, iters: int = 100) -> torch.Tensor:
    """Constrained KL-DRO best response: ``argmax {⟨q, ℓ⟩ : KL(q ‖ p̂) <= ρ}`` with p̂ uniform, ρ = ``radius``.

    Dual form (Hu & Hong 2013, "Kullback-Leibler divergence constrained distributionally robust optimization"):
    ``sup_q ⟨q, ℓ⟩ = inf_{λ>0} λ log E_p̂ exp(ℓ/λ) + λρ``; the dual's derivative in λ is ``ρ − KL(q_λ ‖ p̂)`` with
    ``q_λ = softmax(ℓ/λ)``, so the optimal λ* solves ``KL(q_λ* ‖ p̂) = ρ`` (bisection on log λ) and the worst case
    is ``q_λ*``. When ρ >= the largest reachable divergence (mass on the argmax set), that limit is returned.
    """
    _check_losses(losses)
    v.positive("gcdro", "radius (KL radius ρ)", radius)
    v.integer("gcdro", "iters", iters, minimum=1)
    n = losses.numel()
    spread = float(losses.max() - losses.min())
    if spread <= 0:
        return erm_weights(losses)
    log_n = float(np.log(n))

    def kl(lam: float) -> tuple[torch.Tensor, float]:
        q = torch.softmax(losses / lam, dim=0)
        return q, float((q * (torch.log(q.clamp_min(1e-300)) + log_n)).sum())

    lo, hi = np.log(spread * 1e-6), np.log(spread * 1e6)  # λ range: q ≈ argmax … q ≈ uniform
    q_lo, kl_lo = kl(float(np.exp(lo)))
    if kl_lo <= radius:
        return q_lo
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if kl(float(np.exp(mid)))[1] > radius:
            lo = mid
        else:
            hi = mid
    return kl(float(np.exp(hi)))[0]


def chi2_constrained_worst_case(losses: torch.Tensor, *, radius: float, iters: int = 100) -> torch.Tensor:
    """Constrained χ²-DRO best response: ``argmax {⟨q, ℓ⟩ : D_χ²(q ‖ p̂) = (1/2n) Σ (n q_i − 1)² <= ρ}``.

    Dual form (Duchi & Namkoong 2021, "Learning models with uniform performance via distributionally robust
    optimization", Ann. Statist.): ``sup_q ⟨q, ℓ⟩ = inf_η sqrt(1 + 2ρ) · sqrt(E_p̂ (ℓ − η)_+²) + η``, attained at
    ``q_i ∝ (ℓ_i − η*)_+``; the divergence of that q increases with η, so η* solves ``D_χ²(q_η*) = ρ``: in closed
    form ``η* = mean ℓ − sd ℓ / sqrt(2ρ)`` while η* <= min ℓ (no point clipped), else by bisection on
    ``[min ℓ, max ℓ)``. When ρ exceeds the divergence of the uniform distribution on the argmax set, that limit
    is returned.
    """
    _check_losses(losses)
    v.positive("gcdro", "radius (chi2 radius ρ)", radius)
    v.integer("gcdro", "iters", iters, minimum=1)
    n = losses.numel()
    lmin, lmax = float(losses.min()), float(losses.max())
    if lmax - lmin <= 0:
        return erm_weights(losses)
    mean, sd = float(losses.mean()), float(losses.std(unbiased=False))
    eta = mean - sd / np.sqrt(2.0 * radius)
    if eta <= lmin:
        return (losses - eta) / (n * (mean - eta))

    def div(e: float) -> tuple[torch.Tensor, float]:
        w = torch.clamp(losses - e, min=0.0)
        q = w / w.sum()
        return q, float(0.5 * ((n * q - 1.0) ** 2).mean())

    top = losses >= lmax
    q_top = top.to(losses.dtype) / top.sum()
    if float(0.5 * ((n * q_top - 1.0) ** 2).mean()) <= radius:
        return q_top
    lo, hi = lmin, lmax
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if div(mid)[1] > radius:
            hi = mid
        else:
            lo = mid
    return div(lo)[0]


def tv_from_uniform(q: torch.Tensor | np.ndarray) -> float:
    """Total-variation distance ``½ Σ_i |q_i − 1/n|`` of q from the uniform (empirical) distribution."""
    qa = np.asarray(q.detach().cpu().numpy() if isinstance(q, torch.Tensor) else q, dtype=np.float64)
    return float(0.5 * np.abs(qa - 1.0 / qa.size).sum())
