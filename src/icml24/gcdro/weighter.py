"""GCDRO reweighting for your own minibatch training loop (Liu et al., ICML 2024, arXiv 2311.05054).

    w = GCDROWeighter(n_neighbors=10, alpha=1.0, beta=0.1)
    for xb, yb in loader:
        losses = loss_fn(model(xb), yb, reduction="none")          # (B,) per-sample losses
        weights = w.update(losses, features)                        # (B,) worst-case q, detached, sums to 1
        (weights * losses).sum().backward(); opt.step(); opt.zero_grad()

Per minibatch: a kNN graph of ``features`` (e.g. the inputs or an embedding, detached and standardised per
batch), then ``n_inner`` steps of the upwind Wasserstein gradient flow of the GCDRO free energy
(:func:`icml24.gcdro.core.gradient_flow`) from the uniform distribution on the batch. Everything stays on the
losses' device, the kNN graph included (:func:`icml24.gcdro.core.knn_edges`: pairwise distances by one matmul + ``topk``, the
same graph as the scikit-learn one of :func:`~icml24.gcdro.core.knn_graph`, ties aside).
"""

from __future__ import annotations

import torch

from icml24.common import validate as v
from icml24.gcdro import core

__all__ = ["GCDROWeighter"]


class GCDROWeighter:
    """Minibatch GCDRO weights ``q = w.update(losses, features)`` to plug into any training loop.

    The minibatch analogue of :class:`~icml24.gcdro.GCDRORegressor`'s inner step (restarted from the uniform
    distribution at every batch, as GDRO). NOTE(deviation): the paper trains full batch; per-batch graphs only
    see the geometry inside one batch, so the batch must be large compared with ``n_neighbors``.

    Args:
        n_neighbors: k of the per-batch kNN graph (1 <= k < batch size; clipped to B − 1 for small batches).
        alpha: α >= 0, Dirichlet calibration weight.
        beta: β >= 0, entropy weight.
        n_inner: gradient-flow steps per batch (>= 0; 0 gives uniform weights, i.e. ERM).
        step_scale: c in (0, 1) of the adaptive step.
        sigma: Gaussian bandwidth of the graph (None = median kNN distance of the batch).
        normalize_loss: divide losses by their batch mean first (makes α, β scale-free).
        standardize_features: standardise the features per batch before the kNN search.

    Attributes:
        last_weights: the weights of the last batch (detached); ``n_updates``: batches seen.
    """

    def __init__(self, *, n_neighbors: int = 10, alpha: float = 1.0, beta: float = 0.1, n_inner: int = 10,
                 step_scale: float = 0.5, sigma: float | None = None, normalize_loss: bool = True,
                 standardize_features: bool = True) -> None:
        w = "GCDROWeighter"
        self.n_neighbors = v.integer(w, "n_neighbors", n_neighbors, minimum=1)
        self.alpha = v.non_negative(w, "alpha", alpha)
        self.beta = v.non_negative(w, "beta", beta)
        self.n_inner = v.integer(w, "n_inner", n_inner, minimum=0)
        self.step_scale = v.probability(w, "step_scale", step_scale, open_low=True, open_high=True)
        self.sigma = None if sigma is None else v.positive(w, "sigma", sigma)
        self.normalize_loss = bool(normalize_loss)
        self.standardize_features = bool(standardize_features)
        self.last_weights: torch.Tensor | None = None
        self.n_updates = 0

    def update(self, losses: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Worst-case weights of this batch.

        Args:
            losses: ``(B,)`` per-sample losses (any graph; they are detached here).
            features: ``(B, ...)`` per-sample features defining the geometry (flattened to ``(B, D)``).

        Returns:
            ``(B,)`` detached weights q >= 0 with Σ q = 1, dtype and device of ``losses``; use
            ``(q * losses).sum()`` as the training loss.
        """
        w = "GCDROWeighter.update"
        v.tensor(w, "losses", losses, ndim=1, floating=True)
        v.tensor(w, "features", features)
        b = v.same_length(w, ("losses", "features"), losses.shape[0], features.shape[0])
        if b < 2:
            raise ValueError(f"{w}: a batch needs >= 2 samples for a graph, got {b}")
        ell = losses.detach()
        if not torch.isfinite(ell).all():
            raise ValueError(f"{w}: losses contain NaN or inf")
        z = features.detach().reshape(b, -1).to(device=ell.device, dtype=torch.float64)
        if not torch.isfinite(z).all():
            raise ValueError(f"{w}: features contain NaN or inf")
        if self.standardize_features:
            sd = z.std(0, unbiased=False)
            z = (z - z.mean(0)) / torch.where(sd > 0, sd, torch.ones_like(sd))
        edges = core.knn_edges(z, n_neighbors=min(self.n_neighbors, b - 1), sigma=self.sigma)
        ell64 = ell.to(torch.float64)
        if self.normalize_loss:
            ell64 = ell64 / ell64.mean().clamp_min(1e-12)
        q = core.gradient_flow(ell64, edges, alpha=self.alpha, beta=self.beta, n_steps=self.n_inner,
                               step_scale=self.step_scale)
        q = (q / q.sum()).to(losses.dtype)
        self.last_weights = q
        self.n_updates += 1
        return q
