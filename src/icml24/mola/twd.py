"""Task-wise Decorrelation (TwD) loss of MoLA-Router (Zhou et al., ICML 2024, arXiv 2406.09679).

Official code: https://github.com/MediaBrain-SJTU/MoLA (``scl_loss.py``, weight 0.1 in the loss assembly).
A supervised-contrastive loss on routing embeddings with the task id as the class, τ = 1:

    ū_i = u_i / ||u_i||,   s_ij = ū_iᵀ ū_j / τ,   P = {(i, j): j ≠ i, t_j = t_i}
    L_TwD = (1/|P|) Σ_{(i,j)∈P} −log( exp(s_ij) / Σ_{k≠i} exp(s_ik) )

It pulls the routing of same-task samples together and pushes different tasks apart.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from icml24.common import validate as v

__all__ = ["twd_loss"]


def twd_loss(gates: torch.Tensor, task_ids: torch.Tensor, *, tau: float = 1.0,
             reduction: Literal["pairs", "anchors"] = "pairs") -> torch.Tensor:
    """Task-wise Decorrelation loss on per-sample routing vectors.

    Args:
        gates: ``(B, D)`` routing vectors ``u_i`` (official: the router logits projected by a trainable
            ``Linear(E, 32)``, see :meth:`icml24.mola.Router.embed`; gates or raw logits also work).
        task_ids: ``(B,)`` integer task ids ``t_i`` (the contrastive classes).
        tau: temperature ``τ > 0`` (official 1.0).
        reduction: ``"pairs"`` averages over all ordered positive pairs (official ``scl_loss.py``);
            ``"anchors"`` averages each anchor's positives first, then over anchors (textbook SupCon).

    Returns:
        A scalar. When no task appears twice in the batch there is no positive pair and the loss is ``0``
        (still attached to the graph, so ``backward`` works); the official code raises there.
    """
    if not isinstance(gates, torch.Tensor) or gates.dim() != 2:
        raise ValueError("mola: twd_loss gates must be a 2-D tensor (batch, dim)")
    if not isinstance(task_ids, torch.Tensor) or task_ids.dim() != 1:
        raise ValueError("mola: twd_loss task_ids must be a 1-D tensor (batch,)")
    if task_ids.dtype.is_floating_point or task_ids.dtype.is_complex:
        raise TypeError(f"mola: twd_loss task_ids must be integers, got dtype {task_ids.dtype}")
    if task_ids.shape[0] != gates.shape[0]:
        raise ValueError(f"mola: twd_loss got {gates.shape[0]} gates but {task_ids.shape[0]} task ids")
    v.positive("mola", "tau", tau)
    v.one_of("mola", "reduction", reduction, ("pairs", "anchors"))
    task_ids = task_ids.to(gates.device)
    b = gates.shape[0]
    u = F.normalize(gates.float(), dim=1)
    s = u @ u.t() / tau
    eye = torch.eye(b, dtype=torch.bool, device=gates.device)
    # log( exp(s_ij) / Σ_{k≠i} exp(s_ik) ), stable via log-sum-exp; the diagonal is excluded (S_ii := 0)
    log_prob = s - torch.logsumexp(s.masked_fill(eye, float("-inf")), dim=1, keepdim=True)
    pos = (task_ids.view(-1, 1) == task_ids.view(1, -1)) & ~eye
    n_pos = pos.sum(dim=1)
    if int(n_pos.sum()) == 0:
        return gates.sum() * 0.0
    nll = -(log_prob * pos).sum(dim=1)  # per-anchor sum over positives
    if reduction == "pairs":
        return nll.sum() / n_pos.sum()
    has = n_pos > 0
    return (nll[has] / n_pos[has]).mean()
