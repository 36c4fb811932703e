"""ACR, the baseline: Wei & Gan, "Towards Realistic Long-Tailed Semi-Supervised Learning: Consistency Is All You
Need" (CVPR 2023). Official code: https://github.com/Gank0078/ACR (``train.py``, read; implemented here from its
equations, not copied).

A shared backbone with two linear heads: a standard head f (trained like FixMatch) and a balanced head g (trained
with logit adjustment by the labeled prior π_l, used at test time). With ``A(π, τ) = log(π^τ + 1e-12)``:

    L_x   = CE(f(x_l), y) + CE(g(x_l) + A(π_l, τ2), y)                              (labeled weak view only)
    ŷ     = argmax softmax(f(A_w x_u) − A(π_l, τ̂)),   m = [max ≥ t] ∨ [max softmax(f(A_w x_u)) ≥ t]
    ŷ_b   = argmax softmax(f(A_w x_u) − A(π_l, τ12)), m_b = [max ≥ t] ∨ [max softmax(g(A_w x_u)) ≥ t]
    L_u   = mean_views[ m · CE(f(A_s x_u), ŷ) ] + mean_views[ m_b · CE(g(A_s x_u), ŷ_b) ]     (two strong views)
    loss  = L_x + L_u

Its own estimate of the unlabeled class distribution (every step, once the estimation has started): the
normalised count of the balanced head's confident hard pseudo-labels, EMA-smoothed,

    π̂_u ← ema·π̂_u + (1−ema)·normalise(Σ_i [max softmax(g(A_w x_u))_i ≥ t] · onehot(argmax g(A_w x_u)_i)),

and the adaptive consistency strength, once per period from the mean symmetric KL of π̂_u to three anchor
distributions (consistent π_l, uniform, reversed π_l):

    τ̂ = τ_min + (τ_max − τ_min) · exp(D_con) / (exp(D_con) + exp(D_uni) + exp(D_rev)),  τ_min = 0, τ_max = τ1,
    D_a = mean over the period's estimating steps (divided by the period length) of ½KL(π̂_u‖a) + ½KL(a‖π̂_u).

Test-time prediction: ``argmax g(x)`` (the official code reports the balanced head's accuracy).

NOTE(deviation): the estimate counts every confident balanced-head pseudo-label (``index_add``, the equation
above). The official ``now_mask[targets_u_b] += mask_b`` is an index-put without accumulation: of several samples
with the same pseudo-label one write survives, so the official per-step "count" is a 0/1 presence vector per
class. ``official_index_put=True`` reproduces it (used by the line-by-line reference test).
NOTE(deviation): no ``interleave``: one forward over the concatenated views (on one device the BN batch is the
same set of samples either way); ``mask_l`` (all ones for labelled-truth datasets) is dropped.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v

__all__ = ["ACRLoss", "DualHeadNet", "dual_head", "symmetric_kl"]

_OWNER = "ACRLoss"


def _adjust(pi: torch.Tensor, tau: float | torch.Tensor) -> torch.Tensor:
    return torch.log(pi ** tau + 1e-12)


def symmetric_kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """½KL(p‖q) + ½KL(q‖p) (terms with a zero probability count as 0 in their own KL, as ``xlogy``)."""
    return 0.5 * (torch.xlogy(p, p) - p * torch.log(q)).sum() + 0.5 * (torch.xlogy(q, q) - q * torch.log(p)).sum()


class DualHeadNet(nn.Module):
    """A backbone with two linear heads: ``forward_both(x) -> (f, g)``; ``forward(x)`` is the balanced head g
    (ACR's test-time prediction, ``argmax g(x)``)."""

    def __init__(self, *, body: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        if not isinstance(head, nn.Linear):
            raise TypeError(f"DualHeadNet: head must be an nn.Linear, got {type(head).__name__}")
        self.body, self.head = body, head
        self.head_b = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None).to(
            device=head.weight.device, dtype=head.weight.dtype)

    def forward_both(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.body(x)
        return self.head(z), self.head_b(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head_b(self.body(x))


def dual_head(model: nn.Module) -> DualHeadNet:
    """Split ``model`` into backbone + last linear layer and add ACR's balanced head (a new linear layer).

    Accepts an ``nn.Linear`` (the backbone is the identity), or a module with ``features`` and ``head`` where
    ``head`` is an ``nn.Linear`` or an ``nn.Sequential`` ending in one (the rest of it joins the backbone).
    """
    if isinstance(model, nn.Linear):
        return DualHeadNet(body=nn.Identity(), head=model)
    feats, head = getattr(model, "features", None), getattr(model, "head", None)
    if isinstance(feats, nn.Module) and isinstance(head, nn.Linear):
        body: nn.Module = _Body(model)
        return DualHeadNet(body=body, head=head)
    if isinstance(feats, nn.Module) and isinstance(head, nn.Sequential) and isinstance(head[-1], nn.Linear):
        last = head[-1]
        return DualHeadNet(body=_Body(model, rest=head[:-1]), head=last)
    raise TypeError(f"dual_head: cannot split {type(model).__name__}: need an nn.Linear or a module with "
                    "`features` and a linear (or Sequential ending in linear) `head`")


class _Body(nn.Module):
    """``model`` up to its last linear layer (its own forward with the head swapped for identity / the rest)."""

    def __init__(self, model: nn.Module, rest: nn.Module | None = None) -> None:
        super().__init__()
        self.model = copy.copy(model)  # shallow: shares parameters, its own _modules dict
        self.model._modules = dict(model._modules)
        self.model._modules["head"] = rest if rest is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class ACRLoss(nn.Module):
    """ACR's losses, its estimate of the unlabeled class distribution and its adaptive τ.

    Per step: ``loss = crit(f_l=, g_l=, y_l=, f_u_w=, g_u_w=, f_u_s=[views], g_u_s=[views])`` (the estimate is
    updated inside when active); once per period ``crit.update_priors()`` (the official epoch boundary: refreshes
    τ̂ from the period's KL statistics, after ``est_start`` periods).

    Args:
        num_classes: K.
        labeled_counts: per-class labeled counts (π_l).
        tau1: τ_max of the adaptive consistency adjustment (official 2).
        tau12: τ of the balanced head's pseudo-label adjustment (official 2).
        tau2: τ of the balanced head's labeled logit adjustment (official 2).
        threshold: t ∈ (0, 1) (official 0.95).
        ema_u: per-step EMA of π̂_u (official 0.9).
        est_start: estimation runs in periods with index > ``est_start`` (official ``est_epoch`` 5 of 500).
        temperature: T of the pseudo-label softmax (official 1).
        official_index_put: accumulate the class counts with the official ``now_mask[ŷ_b] += m_b`` (an index-put
            without accumulation: of several samples with the same class, one write survives) instead of the
            equation's count (``index_add``). For the reference test.
    """

    pi_l: torch.Tensor
    pi_u: torch.Tensor

    def __init__(self, *, num_classes: int, labeled_counts: Sequence[int] | torch.Tensor, tau1: float = 2.0,
                 tau12: float = 2.0, tau2: float = 2.0, threshold: float = 0.95, ema_u: float = 0.9,
                 est_start: int = 5, temperature: float = 1.0, official_index_put: bool = False) -> None:
        super().__init__()
        self.num_classes = v.integer(_OWNER, "num_classes", num_classes, minimum=2)
        self.tau1 = v.non_negative(_OWNER, "tau1", tau1)
        self.tau12 = v.non_negative(_OWNER, "tau12", tau12)
        self.tau2 = v.non_negative(_OWNER, "tau2", tau2)
        self.threshold = v.probability(_OWNER, "threshold", threshold, open_low=True, open_high=True)
        self.ema_u = v.probability(_OWNER, "ema_u", ema_u, open_high=True)
        self.est_start = v.integer(_OWNER, "est_start", est_start, minimum=0)
        self.temperature = v.positive(_OWNER, "temperature", temperature)
        self.official_index_put = bool(official_index_put)
        counts = torch.as_tensor(labeled_counts, dtype=torch.float64).flatten()
        if counts.numel() != self.num_classes:
            raise ValueError(f"{_OWNER}: labeled_counts has {counts.numel()} entries, num_classes is "
                             f"{self.num_classes}")
        if not torch.isfinite(counts).all() or (counts < 1).any():
            raise ValueError(f"{_OWNER}: every class needs >= 1 labeled sample, got labeled_counts {counts.tolist()}")
        pi_l = (counts / counts.sum()).float()
        k = self.num_classes
        self.register_buffer("pi_l", pi_l)
        self.register_buffer("anchors", torch.stack([pi_l, torch.full_like(pi_l, 1 / k), pi_l.flip(0)]))
        self.register_buffer("pi_u", torch.full_like(pi_l, 1 / k))
        self.register_buffer("count_kl", torch.zeros(3))
        self.register_buffer("tau_hat", torch.tensor(float(self.tau1)))
        self.register_buffer("adj_1", _adjust(pi_l, self.tau1))
        self.register_buffer("adj_12", _adjust(pi_l, self.tau12))
        self.register_buffer("adj_2", _adjust(pi_l, self.tau2))
        self.updates = 0
        self.period_steps = 0

    @property
    def pi_train(self) -> torch.Tensor:
        """ACR adjusts its losses by the labeled prior only (no estimated training prior)."""
        return self.pi_l

    @property
    def estimating(self) -> bool:
        return self.updates > self.est_start

    # -------------------------------------------------------------------------------------------- step
    def forward(self, *, f_l: torch.Tensor, g_l: torch.Tensor, y_l: torch.Tensor, f_u_w: torch.Tensor,
                g_u_w: torch.Tensor, f_u_s: Sequence[torch.Tensor], g_u_s: Sequence[torch.Tensor],
                accumulate: bool = True) -> torch.Tensor:
        """The step's loss L_x + L_u (see the module docstring); updates π̂_u and the KL statistics when the
        estimation is active and ``accumulate``."""
        k = self.num_classes
        for name, t in (("f_l", f_l), ("g_l", g_l), ("f_u_w", f_u_w), ("g_u_w", g_u_w)):
            v.tensor(_OWNER, name, t, ndim=2, floating=True)
            if t.shape[1] != k:
                raise ValueError(f"{_OWNER}: {name} has {t.shape[1]} classes, expected {k}")
        v.tensor(_OWNER, "y_l", y_l, ndim=1, dtype=torch.long)
        if len(y_l) == 0 or f_l.shape[0] != len(y_l) or g_l.shape[0] != len(y_l):
            raise ValueError(f"{_OWNER}: f_l, g_l and y_l must be non-empty with equal rows, got {f_l.shape[0]}, "
                             f"{g_l.shape[0]}, {len(y_l)}")
        if (y_l < 0).any() or (y_l >= k).any():
            raise ValueError(f"{_OWNER}: labels y_l must lie in [0, {k}), got range [{int(y_l.min())}, "
                             f"{int(y_l.max())}]")
        n_u = f_u_w.shape[0]
        if n_u == 0 or g_u_w.shape[0] != n_u:
            raise ValueError(f"{_OWNER}: f_u_w and g_u_w must be non-empty with equal rows, got {n_u}, "
                             f"{g_u_w.shape[0]}")
        if len(f_u_s) == 0 or len(f_u_s) != len(g_u_s) or any(t.shape != f_u_w.shape for t in (*f_u_s, *g_u_s)):
            raise ValueError(f"{_OWNER}: f_u_s and g_u_s must hold the same number (>= 1) of strong views, each "
                             f"shaped like f_u_w {tuple(f_u_w.shape)}")
        lx = F.cross_entropy(f_l, y_l) + F.cross_entropy(g_l + self.adj_2.to(g_l.dtype), y_l)
        with torch.no_grad():  # hard pseudo-labels and masks (no gradient), in fp32
            fw, gw, tt, t = f_u_w.detach().float(), g_u_w.detach().float(), self.temperature, self.threshold
            conf, y_hat = torch.softmax((fw - self.adj_1) / tt, -1).max(-1)
            conf12, y_hat_b = torch.softmax((fw - self.adj_12) / tt, -1).max(-1)
            conf_g, arg_g = torch.softmax(gw / tt, -1).max(-1)
            conf_f = torch.softmax(fw / tt, -1).max(-1).values
            m = ((conf >= t) | (conf_f >= t)).to(f_u_w.dtype)
            m_b = ((conf12 >= t) | (conf_g >= t)).to(g_u_w.dtype)
            if accumulate:
                self.period_steps += 1
                if self.estimating:
                    self._estimate(arg_g, (conf_g >= t).float())
        nv = len(f_u_s)
        lu = (F.cross_entropy(torch.cat(list(f_u_s)), y_hat.repeat(nv), reduction="none") * m.repeat(nv)).mean()
        lu_b = (F.cross_entropy(torch.cat(list(g_u_s)), y_hat_b.repeat(nv), reduction="none")
                * m_b.repeat(nv)).mean()
        return lx + lu + lu_b

    @torch.no_grad()
    def _estimate(self, arg_g: torch.Tensor, conf_mask: torch.Tensor) -> None:
        counts = torch.zeros(self.num_classes, device=self.pi_u.device)
        if self.official_index_put:
            counts.index_put_((arg_g,), counts[arg_g] + conf_mask)  # one write per class survives (official)
        else:
            counts.index_add_(0, arg_g, conf_mask)
        if counts.sum() > 0:
            self.pi_u.mul_(self.ema_u).add_((1 - self.ema_u) * counts / counts.sum())
            for j in range(3):
                self.count_kl[j] += symmetric_kl(self.anchors[j], self.pi_u)

    # -------------------------------------------------------------------------------------------- period
    @torch.no_grad()
    def update_priors(self) -> torch.Tensor:
        """End of a period (the official epoch boundary): the next period's τ̂ from this period's KL statistics
        (once the estimation has run), then the statistics reset. Returns the current π̂_u."""
        self.updates += 1
        if self.estimating:
            d = self.count_kl / max(self.period_steps, 1)
            w = torch.exp(d[0]) / torch.exp(d).sum()
            tau = 0.0 + (self.tau1 - 0.0) * w
            if not torch.isnan(tau):
                self.tau_hat.copy_(tau)
                self.adj_1.copy_(_adjust(self.pi_l, tau))
        self.count_kl.zero_()
        self.period_steps = 0
        return self.pi_u.clone()

    def get_extra_state(self) -> dict[str, int]:
        return {"updates": int(self.updates), "period_steps": int(self.period_steps)}

    def set_extra_state(self, state: Any) -> None:
        if not (isinstance(state, dict) and all(isinstance(state.get(n), int) and state[n] >= 0
                                                for n in ("updates", "period_steps"))):
            raise ValueError(f"{_OWNER}: the checkpoint's _extra_state must be {{'updates': int, 'period_steps': "
                             f"int}}, got {state!r}")
        self.updates, self.period_steps = state["updates"], state["period_steps"]

    def extra_repr(self) -> str:
        return (f"num_classes={self.num_classes}, tau1={self.tau1}, tau12={self.tau12}, tau2={self.tau2}, "
                f"threshold={self.threshold}, ema_u={self.ema_u}, est_start={self.est_start}")
