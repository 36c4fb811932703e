"""SimPro: A Simple Probabilistic Framework Towards Realistic Long-Tailed Semi-Supervised Learning (ICML 2024).

arXiv 2402.13505 · official code: https://github.com/LeapLabTHU/SimPro

The network's logits f_θ(x) are read as class-conditional log-likelihood scores, log p(x|y) up to an x-only
constant; the labeled, unlabeled and test sets share p(x|y) and differ only in their class priors π_l, π_u
(unknown) and π_t (uniform). EM with the priors decoupled from θ:

    E-step   q(y | x_u) = softmax(f_θ(A_w(x_u)) + τ log π̂_u)          (Bayes posterior under π̂_u; soft)
    M-step   π̂_u ← ema·π̂_u + (1−ema)·Σ_{confident} q / (Σ q + 1)       (closed form, once per period)
             π̂ ← ema·π̂ + (1−ema)·normalise(labeled counts + Σ_{confident} q)
    θ-step   L = CE(f_θ(x_l) + τ log π̂, y_l)/r + mean_views[ 1{max q ≥ t} · CE(f_θ(A_s(x_u)) + τ log π̂, q) ]
    test     argmax f_θ(x)   (Bayes rule under the uniform test prior)

r = (unlabeled batches per pass)/(labeled batches per pass) equalises the per-sample weight of the two sets.
The same class runs the baselines on the same code path: FixMatch (``tau=0``, hard labels, no updates) and
FixMatch with logit adjustment by the labeled prior (priors fixed at π_l, hard labels).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v

__all__ = ["SimProLoss", "bayes_posterior", "em_prior", "masked_soft_cross_entropy", "kl_divergence"]

_OWNER = "SimProLoss"


def bayes_posterior(log_lik: torch.Tensor, prior: torch.Tensor, *, tau: float = 1.0) -> torch.Tensor:
    """``softmax(log p(x|y) + τ log π)``: the Bayes posterior under the prior π (τ = 1).

    Args:
        log_lik: ``(N, K)`` class-conditional log-likelihoods (or logits read as such).
        prior: ``(K,)`` class prior π (non-negative, summing to 1).
        tau: τ, the adjustment strength (the official code's ``log(π^τ + 1e-12)``).
    """
    v.tensor("bayes_posterior", "log_lik", log_lik, ndim=2, floating=True)
    v.tensor("bayes_posterior", "prior", prior, ndim=1, floating=True)
    if prior.shape[0] != log_lik.shape[1]:
        raise ValueError(f"bayes_posterior: prior has {prior.shape[0]} classes, log_lik {log_lik.shape[1]}")
    return torch.softmax(log_lik + _log_adjust(prior, tau).to(log_lik.dtype), dim=-1)


def em_prior(log_lik: torch.Tensor, *, init: torch.Tensor | None = None, iters: int = 200,
             tol: float = 1e-10) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """EM for the mixture weights π with fixed class-conditionals: π ← mean_i softmax(log p(x_i|y) + log π).

    The fixed point is the maximum-likelihood π of ``Π_i Σ_y π_y p(x_i|y)``. This is SimPro's closed-form
    M-step run to convergence on one batch (all samples, no threshold, no EMA).

    Returns:
        The final π and the list of iterates (starting with ``init``; uniform when ``None``).
    """
    v.tensor("em_prior", "log_lik", log_lik, ndim=2, floating=True)
    iters = v.integer("em_prior", "iters", iters, minimum=1)
    k = log_lik.shape[1]
    pi = torch.full((k,), 1.0 / k, dtype=log_lik.dtype, device=log_lik.device) if init is None else init.clone()
    path = [pi.clone()]
    for _ in range(iters):
        new = bayes_posterior(log_lik, pi).mean(0)
        path.append(new)
        if (new - pi).abs().max() < tol:
            pi = new
            break
        pi = new
    return pi, path


def masked_soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``mean_i mask_i · (−Σ_y q_iy log softmax(z_i)_y)``: averaged over ALL rows (masked rows count as 0)."""
    return (F.cross_entropy(logits, targets, reduction="none") * mask.to(logits.dtype)).mean()


def kl_divergence(p: torch.Tensor, q: torch.Tensor, eps: float = 1e-12) -> float:
    """KL(p ‖ q) = Σ p log(p/q) of two distributions over classes (terms with p = 0 are 0)."""
    p, q = p.double(), q.double()
    return float(torch.where(p > 0, p * (torch.log(p + eps) - torch.log(q + eps)), torch.zeros_like(p)).sum())


def _log_adjust(pi: torch.Tensor, tau: float) -> torch.Tensor:
    return torch.log(pi.clamp_min(0) ** tau + 1e-12) if tau != 0 else torch.zeros_like(pi)


def _views(x: torch.Tensor | Sequence[torch.Tensor], name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        x = [x]
    if len(x) == 0:
        raise ValueError(f"{_OWNER}: {name} must hold at least one view")
    for t in x:
        v.tensor(_OWNER, name, t, ndim=2, floating=True)
    return torch.cat(list(x), 0)


class SimProLoss(nn.Module):
    """SimPro's pseudo-labels, loss and closed-form prior updates, for any network that returns logits.

    Usage in a training loop (one "period" = ``update_period`` steps; the official code uses 500)::

        crit = SimProLoss(num_classes=K, labeled_counts=n_l, tau=2.0, threshold=0.95)
        q, mask = crit.pseudo_label(logits_u_weak)                    # E-step (accumulates Σ q)
        loss = crit(logits_l=[l_w, l_s], y_l=y, logits_u=[u_s1, u_s2], q=q, mask=mask, scale_ratio=r)
        ...; if (step + 1) % period == 0: crit.update_priors()        # M-step; adjustments frozen in between

    Args:
        num_classes: K.
        labeled_counts: per-class labeled counts (π_l = counts / Σ counts, the init of π̂).
        tau: τ in ``log(π^τ)``; 0 disables every adjustment (plain FixMatch).
        threshold: confidence threshold t ∈ (0, 1) on the adjusted posterior.
        ema_u: EMA factor of both prior estimates per update (official 0.9).
        pi_estimate_on: ``"confident"`` (official: Σ q over samples with max q ≥ t) or ``"all"`` (every
            unlabeled posterior, the plain EM M-step).
        soft_targets: soft posterior targets (SimPro) or one-hot argmax (FixMatch).
        estimate_priors: run the M-step in :meth:`update_priors` (False: priors stay at their init).
        pi_u_init: ``"uniform"`` (SimPro) or ``"labeled"`` (assume consistent: FixMatch + LA).
        plus_one: normalise the per-period estimate by ``Σq + 1`` as the official code (else by ``Σq``).

    ``state_dict()`` holds the priors, the adjustments, this period's statistics (``sum_q``, ``count_labeled``) and the
    M-step counter ``updates`` (as ``_extra_state``): a run checkpointed mid-period and resumed equals the
    uninterrupted run.
    """

    pi_u: torch.Tensor
    pi_train: torch.Tensor
    pi_l: torch.Tensor

    def __init__(self, *, num_classes: int, labeled_counts: Sequence[int] | torch.Tensor, tau: float = 1.0,
                 threshold: float = 0.95, ema_u: float = 0.9,
                 pi_estimate_on: Literal["confident", "all"] = "confident", soft_targets: bool = True,
                 estimate_priors: bool = True, pi_u_init: Literal["uniform", "labeled"] = "uniform",
                 plus_one: bool = True) -> None:
        super().__init__()
        self.num_classes = v.integer(_OWNER, "num_classes", num_classes, minimum=2)
        self.tau = v.non_negative(_OWNER, "tau", tau)
        self.threshold = v.probability(_OWNER, "threshold", threshold, open_low=True, open_high=True)
        self.ema_u = v.probability(_OWNER, "ema_u", ema_u, open_high=True)
        self.pi_estimate_on = v.one_of(_OWNER, "pi_estimate_on", pi_estimate_on, ("confident", "all"))
        v.one_of(_OWNER, "pi_u_init", pi_u_init, ("uniform", "labeled"))
        self.soft_targets, self.estimate_priors, self.plus_one = bool(soft_targets), bool(estimate_priors), plus_one
        counts = torch.as_tensor(labeled_counts, dtype=torch.float64).flatten()
        if counts.numel() != self.num_classes:
            raise ValueError(f"{_OWNER}: labeled_counts has {counts.numel()} entries, num_classes is "
                             f"{self.num_classes}")
        if not torch.isfinite(counts).all() or (counts < 1).any():
            raise ValueError(f"{_OWNER}: every class needs >= 1 labeled sample, got labeled_counts "
                             f"{counts.tolist()}")
        pi_l = (counts / counts.sum()).float()
        self.register_buffer("pi_l", pi_l)
        self.register_buffer("pi_u", pi_l.clone() if pi_u_init == "labeled" else torch.full_like(pi_l, 1 / num_classes))
        self.register_buffer("pi_train", pi_l.clone())
        self.register_buffer("sum_q", torch.zeros_like(pi_l))
        self.register_buffer("count_labeled", torch.zeros_like(pi_l))
        self.register_buffer("last_estimate", torch.full_like(pi_l, float("nan")))
        self.register_buffer("adj_u", _log_adjust(self.pi_u, self.tau))
        self.register_buffer("adj", _log_adjust(self.pi_train, self.tau))
        self.updates = 0

    # ------------------------------------------------------------------------------------------ E-step
    @torch.no_grad()
    def pseudo_label(self, logits_u_weak: torch.Tensor, *, accumulate: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pseudo-labels q = softmax(f(A_w(x_u)) + τ log π̂_u) and the confidence mask max q ≥ t.

        Args:
            logits_u_weak: ``(B_u, K)`` logits of the weak views (detached here).
            accumulate: add Σ q (over the samples ``pi_estimate_on`` selects) to this period's M-step statistics.

        Returns:
            ``(targets, mask)``: soft posteriors (or one-hot argmax when ``soft_targets=False``), float mask.
        """
        v.tensor(_OWNER, "logits_u_weak", logits_u_weak, ndim=2, floating=True)
        if logits_u_weak.shape[0] == 0:
            raise ValueError(f"{_OWNER}: the unlabeled batch is empty (logits_u_weak has shape "
                             f"{tuple(logits_u_weak.shape)})")
        if logits_u_weak.shape[1] != self.num_classes:
            raise ValueError(f"{_OWNER}: logits_u_weak has {logits_u_weak.shape[1]} classes, expected "
                             f"{self.num_classes}")
        q = torch.softmax(logits_u_weak.detach().float() + self.adj_u, dim=-1)
        conf, arg = q.max(-1)
        mask = conf >= self.threshold
        if accumulate:
            self.sum_q += (q[mask] if self.pi_estimate_on == "confident" else q).sum(0)
        targets = q if self.soft_targets else F.one_hot(arg, self.num_classes).float()
        return targets, mask.float()

    # ------------------------------------------------------------------------------------------ θ-step
    def forward(self, *, logits_l: torch.Tensor | Sequence[torch.Tensor], y_l: torch.Tensor,
                logits_u: torch.Tensor | Sequence[torch.Tensor] | None = None, q: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, scale_ratio: float = 1.0, accumulate: bool = True
                ) -> torch.Tensor:
        """L = CE(f(x_l) + τ log π̂, y_l)/r + mean over all unlabeled views of mask · CE(f(A_s(x_u)) + τ log π̂, q).

        Args:
            logits_l: labeled logits, one ``(B, K)`` tensor per view (official: weak and strong view).
            y_l: ``(B,)`` labels in ``[0, K)``.
            logits_u: strong-view unlabeled logits, one ``(B_u, K)`` tensor per view (official: two); ``None``
                for a supervised-only loss.
            q, mask: from :meth:`pseudo_label` on the same unlabeled batch.
            scale_ratio: r, unlabeled batches per labeled batch per pass over each set.
            accumulate: add the labeled class counts of ``y_l`` (once per batch) to this period's statistics.
        """
        zl = _views(logits_l, "logits_l")
        v.tensor(_OWNER, "y_l", y_l, ndim=1, dtype=torch.long)
        scale_ratio = v.positive(_OWNER, "scale_ratio", scale_ratio)
        nviews = zl.shape[0] // max(y_l.shape[0], 1)
        if y_l.shape[0] == 0 or nviews * y_l.shape[0] != zl.shape[0]:
            raise ValueError(f"{_OWNER}: logits_l views hold {zl.shape[0]} rows, not a multiple of len(y_l)="
                             f"{y_l.shape[0]}")
        if zl.shape[1] != self.num_classes:
            raise ValueError(f"{_OWNER}: logits_l has {zl.shape[1]} classes, expected {self.num_classes}")
        if (y_l < 0).any() or (y_l >= self.num_classes).any():
            raise ValueError(f"{_OWNER}: labels y_l must lie in [0, {self.num_classes}), got range "
                             f"[{int(y_l.min())}, {int(y_l.max())}]")
        adj = self.adj.to(zl.dtype)
        loss = F.cross_entropy(zl + adj, y_l.repeat(nviews)) / scale_ratio
        if accumulate:
            self.count_labeled += torch.bincount(y_l, minlength=self.num_classes).to(self.count_labeled.dtype)
        if logits_u is None:
            return loss
        if q is None or mask is None:
            raise ValueError(f"{_OWNER}: logits_u needs the q and mask of pseudo_label")
        zu = _views(logits_u, "logits_u")
        if zu.shape[0] == 0:
            raise ValueError(f"{_OWNER}: the unlabeled batch is empty")
        m = zu.shape[0] // q.shape[0]
        if m * q.shape[0] != zu.shape[0] or mask.shape[0] != q.shape[0]:
            raise ValueError(f"{_OWNER}: logits_u views hold {zu.shape[0]} rows, q {q.shape[0]}, mask "
                             f"{mask.shape[0]}: views must each match the pseudo-labelled batch")
        return loss + masked_soft_cross_entropy(zu + adj, q.repeat(m, 1), mask.repeat(m))

    # ------------------------------------------------------------------------------------------ M-step
    @torch.no_grad()
    def update_priors(self) -> torch.Tensor:
        """Closed-form M-step for π̂_u and π̂ from this period's statistics, EMA-smoothed; resets the statistics
        and refreshes the frozen adjustments. Returns this period's raw estimate e (before the EMA).

        Under ``torch.distributed`` the statistics are summed over ranks first (call it on every rank)."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # every rank saw different batches: the M-step needs the global sums (the official code omits this)
            torch.distributed.all_reduce(self.sum_q)
            torch.distributed.all_reduce(self.count_labeled)
        s = self.sum_q.clone()
        e = s / (s.sum() + (1.0 if self.plus_one else 0.0)).clamp_min(1e-12)
        self.last_estimate.copy_(e)
        if self.estimate_priors:
            self.pi_u.mul_(self.ema_u).add_((1 - self.ema_u) * e)
            c = self.count_labeled + s
            if c.sum() > 0:
                self.pi_train.mul_(self.ema_u).add_((1 - self.ema_u) * c / c.sum())
            self.adj_u.copy_(_log_adjust(self.pi_u, self.tau))
            self.adj.copy_(_log_adjust(self.pi_train, self.tau))
        self.sum_q.zero_()
        self.count_labeled.zero_()
        self.updates += 1
        return e

    # ------------------------------------------------------------------------------------------ checkpoints
    def get_extra_state(self) -> dict[str, int]:
        """The M-step counter ``updates`` (an int, not a buffer), saved in ``state_dict()`` as ``_extra_state``, so a
        resumed run continues the count instead of restarting it at 0."""
        return {"updates": int(self.updates)}

    def set_extra_state(self, state: Any) -> None:
        if not (isinstance(state, dict) and isinstance(state.get("updates"), int)
                and not isinstance(state["updates"], bool) and state["updates"] >= 0):
            raise ValueError(f"{_OWNER}: the checkpoint's _extra_state must be {{'updates': int >= 0}}, got {state!r}")
        self.updates = state["updates"]

    def extra_repr(self) -> str:
        return (f"num_classes={self.num_classes}, tau={self.tau}, threshold={self.threshold}, ema_u={self.ema_u}, "
                f"pi_estimate_on={self.pi_estimate_on!r}, soft_targets={self.soft_targets}, "
                f"estimate_priors={self.estimate_priors}")
