"""Calibration measurements for "Revisit the Essence of Distilling Knowledge through Calibration".

Fan, Lu, Li, Zhan, Gan, ICML 2024 (PMLR 235, ``fan24d``); no arXiv version, no official code.

Expected calibration error with M equal-width, right-closed bins ``B_m = {i : c_i in ((m-1)/M, m/M]}``
over the top-label confidence ``c_i = max_k p_ik`` (Guo et al., 2017)::

    ECE   = sum_m |B_m|/N * |acc(B_m) - conf(B_m)|
    ECE_o = sum_m |B_m|/N * max(conf(B_m) - acc(B_m), 0)      (over-confidence part)
    ECE_u = sum_m |B_m|/N * max(acc(B_m) - conf(B_m), 0)      (under-confidence part; ECE = ECE_o + ECE_u)

Temperature scaling: ``T* = argmin_T NLL(softmax(z / T), y)`` on held-out data; ranking and accuracy are
unchanged by ``T``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from icml24.common import validate as v

__all__ = ["CalibrationMetrics", "ece", "fit_temperature"]


@dataclass(frozen=True)
class CalibrationMetrics:
    """Calibration of one set of predictions (all floats; ``ece == ece_over + ece_under``).

    Attributes:
        ece: expected calibration error (L1 over bins).
        ece_over: over-confidence part ``ECE_o``.
        ece_under: under-confidence part ``ECE_u``.
        mce: maximum calibration error over non-empty bins.
        nll: mean negative log-likelihood of the label.
        brier: mean multi-class Brier score ``sum_k (p_k - 1[k=y])^2``.
        accuracy: top-1 accuracy.
        confidence: mean top-label confidence.
        n_bins: number of bins ``M``.
    """

    ece: float
    ece_over: float
    ece_under: float
    mce: float
    nll: float
    brier: float
    accuracy: float
    confidence: float
    n_bins: int

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _check_inputs(name: str, scores: torch.Tensor, labels: torch.Tensor) -> None:
    v.tensor(name, "logits/probs", scores)
    v.tensor(name, "labels", labels)
    if scores.ndim != 2:
        raise ValueError(f"{name}: logits/probs must have shape (N, C), got {tuple(scores.shape)}")
    if scores.shape[0] < 1 or scores.shape[1] < 2:
        raise ValueError(f"{name}: need N >= 1 samples and C >= 2 classes, got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise TypeError(f"{name}: logits/probs must be a floating tensor, got {scores.dtype}")
    if labels.ndim != 1 or labels.shape[0] != scores.shape[0]:
        raise ValueError(f"{name}: labels must have shape ({scores.shape[0]},), got {tuple(labels.shape)}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise TypeError(f"{name}: labels must be an integer tensor, got {labels.dtype}")
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= scores.shape[1]:
        raise ValueError(f"{name}: labels must lie in [0, {scores.shape[1] - 1}], got values in [{lo}, {hi}]")
    if not torch.isfinite(scores).all():
        raise ValueError(f"{name}: logits/probs contain NaN or inf")


def _looks_like_probs(x: torch.Tensor) -> bool:
    return bool((x >= 0).all() and (x <= 1).all() and torch.allclose(x.sum(1), torch.ones_like(x[:, 0]), atol=1e-4))


def ece(logits_or_probs: torch.Tensor, labels: torch.Tensor, *, n_bins: int = 15,
        from_logits: bool | None = None) -> CalibrationMetrics:
    """Expected calibration error with its over/under-confidence parts, NLL and Brier score.

    Args:
        logits_or_probs: ``(N, C)`` logits ``z`` or probabilities ``p``.
        labels: ``(N,)`` integer labels ``y`` in ``[0, C)``.
        n_bins: number of equal-width confidence bins ``M`` (15, Guo et al. 2017; torchmetrics' default).
        from_logits: ``True`` = softmax is applied, ``False`` = rows are probabilities, ``None`` (default) =
            probabilities if every row is in ``[0, 1]`` and sums to 1 (to 1e-4), else logits.

    Returns:
        :class:`CalibrationMetrics`. Bins are right-closed, ``((m-1)/M, m/M]``; a confidence of exactly 0
        goes to the first bin.

    Raises:
        ValueError / TypeError: bad shapes, labels out of range, ``n_bins < 1``, non-finite inputs, or
            ``from_logits=False`` with rows that are not probabilities.
    """
    v.integer("ece", "n_bins", n_bins, minimum=1)
    _check_inputs("ece", logits_or_probs, labels)
    x = logits_or_probs.detach().double()
    if from_logits is None:
        from_logits = not _looks_like_probs(x)
    if from_logits:
        logp = F.log_softmax(x, dim=1)
        p = logp.exp()
    else:
        if not _looks_like_probs(x):
            raise ValueError("ece: from_logits=False but rows are not probabilities (in [0, 1], summing to 1)")
        p = x / x.sum(1, keepdim=True)
        logp = p.clamp_min(torch.finfo(torch.float64).tiny).log()
    y = labels.to(p.device).long()
    n = p.shape[0]
    conf, pred = p.max(1)
    correct = (pred == y).double()
    # right-closed bins ((m-1)/M, m/M]: index = ceil(c*M) - 1, with c = 0 put in the first bin
    idx = (torch.ceil(conf * n_bins).long() - 1).clamp(0, n_bins - 1)
    count = torch.zeros(n_bins, dtype=torch.float64, device=p.device).index_add_(0, idx, torch.ones_like(conf))
    sum_conf = torch.zeros_like(count).index_add_(0, idx, conf)
    sum_acc = torch.zeros_like(count).index_add_(0, idx, correct)
    gap = (sum_conf - sum_acc) / n  # = |B_m|/N * (conf(B_m) - acc(B_m))
    nonempty = count > 0
    mce = ((sum_conf - sum_acc).abs()[nonempty] / count[nonempty]).max()
    onehot = F.one_hot(y, p.shape[1]).double()
    return CalibrationMetrics(
        ece=float(gap.abs().sum()),
        ece_over=float(gap.clamp_min(0).sum()),
        ece_under=float((-gap).clamp_min(0).sum()),
        mce=float(mce),
        nll=float(-logp.gather(1, y[:, None]).mean()),
        brier=float(((p - onehot) ** 2).sum(1).mean()),
        accuracy=float(correct.mean()),
        confidence=float(conf.mean()),
        n_bins=n_bins,
    )


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, *, max_iter: int = 200,
                    bounds: tuple[float, float] = (1e-2, 1e2)) -> float:
    """Temperature scaling: ``T* = argmin_T mean_i -log softmax(z_i / T)[y_i]`` (Guo et al., 2017).

    Minimised over ``log T`` with L-BFGS (strong-Wolfe line search) in float64, started at ``T = 1``, then
    clamped to ``bounds``. Fit it on a held-out (validation) split, never on the test split.

    Args:
        logits: ``(N, C)`` logits ``z`` (not probabilities).
        labels: ``(N,)`` integer labels.
        max_iter: L-BFGS iterations.
        bounds: ``(T_min, T_max)``, both > 0.

    Returns:
        The fitted temperature ``T*`` as a float; calibrated logits are ``z / T*``.
    """
    _check_inputs("fit_temperature", logits, labels)
    v.integer("fit_temperature", "max_iter", max_iter, minimum=1)
    if not (0 < bounds[0] < bounds[1]):
        raise ValueError(f"fit_temperature: bounds must satisfy 0 < T_min < T_max, got {bounds}")
    z = logits.detach().double()
    y = labels.to(z.device).long()
    log_t = torch.zeros((), dtype=torch.float64, device=z.device, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(z / log_t.exp(), y)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return float(log_t.detach().exp().clamp(*bounds))
