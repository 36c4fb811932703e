"""LoCoCo's convolutional fixed-size KV compressor and the token-eviction rules it is compared with.

LoCoCo: Dropping In Convolutions for Long Context Compression (Cai, Tian, Wang, Chen; ICML 2024; arXiv 2406.05317;
official code VITA-Group/LoCoCo, ``llama/memory_compressor.py``).

Given the L = |memory| + |chunk| cached keys/values of one layer (K, V ∈ R^{b×h×L×d}) and the attention mass s ∈
R^{b×h×L} each of them received from the last chunk's queries, the compressor returns exactly M slots:

    m_hh = M − m_c heavy hitters, kept verbatim (top-m_hh of s, in position order; with ``local_len`` ℓ > 0 the
        last ℓ tokens plus the top-(m_hh − ℓ) of the others, as the repo's ``--local_len``);
    m_c = ⌊M(1 − r)⌋ fused slots over the S = L − m_hh remaining tokens R:
        W = (1 − λ)·E + λ·softmax_S(ReLU(Conv1d([K_R ; V_R])))  ∈ R^{m_c×S},   K_f = W K_R,  V_f = W V_R,

where E is the one-hot selection of the top-m_c remaining tokens by s (rows in position order), the conv's output
channels index the m_c slots, its kernel slides over the token axis ('same' padding), and the same W mixes keys and
values. With λ ∈ [0, 1] every row of W is a convex combination; λ = 0 is top-M selection by s.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v

OWNER = "lococo"


def check_budget(budget: int, hh_keep_rate: float) -> tuple[int, int]:
    """Validate (M, r) and return (m_hh, m_c): heavy-hitter and fused slot counts."""
    M = v.integer(OWNER, "budget", budget, minimum=2)
    r = v.in_range(OWNER, "hh_keep_rate", hh_keep_rate, 0.0, 1.0)
    if r == 0.5 and M % 2:
        raise ValueError(f"{OWNER}: budget must be even when hh_keep_rate=0.5 (half heavy hitters, half fused "
                         f"slots), got {M}")
    m_c = int(M * (1.0 - r))
    return M - m_c, m_c


class LoCoCoCompressor(nn.Module):
    """One layer's LoCoCo memory compressor (shared over heads and batch; KV heads under GQA).

    Args:
        head_dim: d, the per-head key/value size of the model it compresses for.
        budget: M, the number of memory slots returned.
        kernel_size: the 1-D conv kernel over the token axis (odd; repo default 21).
        hh_keep_rate: r, the fraction of slots kept verbatim as heavy hitters (repo default 0.5).
        lambda_init: λ₀, the initial mixing weight between selection (λ=0) and conv fusion (λ=1) (repo 0.5).
        bounded_lambda: keep λ in [0, 1] with λ = sigmoid(ρ) (ours; the repo leaves λ unconstrained).
        learn_lambda: train λ; with False λ is a fixed buffer (λ=0 gives pure selection).
        n_conv_layers: conv depth (repo default 1); hidden width m_c with ReLU after every layer.
        max_window: S_max = the largest fused window it will see (m_c + chunk); the kernel must not exceed it.
        local_len: ℓ, the repo's ``--local_len`` (default 0): the last ℓ cached tokens are kept verbatim as part of
            the m_hh heavy-hitter slots, whatever their scores; the other m_hh − ℓ heavy hitters are the top
            scores among the earlier tokens (0 ≤ ℓ ≤ m_hh). With λ = 0 the kept set is H2O's with ``recent=ℓ``.
    """

    def __init__(self, *, head_dim: int, budget: int, kernel_size: int = 21, hh_keep_rate: float = 0.5,
                 lambda_init: float = 0.5, bounded_lambda: bool = True, learn_lambda: bool = True,
                 n_conv_layers: int = 1, max_window: int | None = None, local_len: int = 0) -> None:
        super().__init__()
        self.head_dim = v.integer(OWNER, "head_dim", head_dim, minimum=1)
        self.m_hh, self.m_c = check_budget(budget, hh_keep_rate)
        self.budget = int(budget)
        self.local_len = v.integer(OWNER, "local_len", local_len, minimum=0)
        if self.local_len > self.m_hh:
            raise ValueError(f"{OWNER}: local_len ({self.local_len}) must be <= the heavy-hitter slots m_hh = M - "
                             f"int(M(1 - r)) = {self.m_hh} (budget {budget}, hh_keep_rate {hh_keep_rate})")
        self.max_window = None if max_window is None else int(max_window)
        k = v.integer(OWNER, "kernel_size", kernel_size, minimum=1)
        if k % 2 == 0:
            raise ValueError(f"{OWNER}: kernel_size must be odd ('same' padding over tokens), got {k}")
        if max_window is not None and k > v.integer(OWNER, "max_window", max_window, minimum=1):
            raise ValueError(f"{OWNER}: kernel_size {k} is larger than the fused window of {max_window} tokens "
                             "(m_c + chunk); use a smaller kernel")
        lam = v.finite(OWNER, "lambda_init", lambda_init)
        self.bounded_lambda, self.learn_lambda = bool(bounded_lambda), bool(learn_lambda)
        if bounded_lambda and not 0.0 <= lam <= 1.0:
            raise ValueError(f"{OWNER}: lambda_init must be in [0, 1] when bounded_lambda=True, got {lam}")
        if bounded_lambda and learn_lambda and not 0.0 < lam < 1.0:
            raise ValueError(f"{OWNER}: a learned bounded λ = sigmoid(ρ) needs lambda_init in (0, 1), got {lam}; "
                             "use learn_lambda=False for a fixed λ of 0 or 1")
        self.kernel_size = k
        n = v.integer(OWNER, "n_conv_layers", n_conv_layers, minimum=1)
        layers: list[nn.Module] = []
        c_in = 2 * self.head_dim
        for _ in range(n):
            conv = nn.Conv1d(c_in, max(self.m_c, 1), k, padding=k // 2)
            nn.init.normal_(conv.weight)  # the repo initialises conv weights with torch.randn (std 1)
            layers += [conv, nn.ReLU()]
            c_in = max(self.m_c, 1)
        self.conv = nn.Sequential(*layers)
        if learn_lambda:
            raw = math.log(lam / (1.0 - lam)) if bounded_lambda else lam
            self.rho = nn.Parameter(torch.tensor(float(raw)))
        else:
            self.register_buffer("rho", torch.tensor(lam))

    @property
    def lam(self) -> torch.Tensor:
        """λ, the weight of the conv fusion against plain selection."""
        if self.learn_lambda and self.bounded_lambda:
            return torch.sigmoid(self.rho)
        return self.rho

    def weights(self, k_rest: torch.Tensor, v_rest: torch.Tensor, s_rest: torch.Tensor) -> torch.Tensor:
        """W = (1−λ)E + λ softmax(ReLU(conv([K_R;V_R]))) ∈ R^{b×h×m_c×S} over the S non-heavy-hitter tokens."""
        b, h, S, d = k_rest.shape
        m_c = self.m_c
        sel = torch.topk(s_rest, m_c, dim=-1).indices.sort(dim=-1).values  # top-m_c by score, position order
        E = F.one_hot(sel, S).to(k_rest.dtype)  # [b,h,m_c,S]
        lam = self.lam.to(k_rest.dtype)
        if not self.learn_lambda and float(lam) == 0.0:
            return E
        x = torch.cat([k_rest, v_rest], dim=-1).reshape(b * h, S, 2 * d).transpose(1, 2)  # [(bh), 2d, S]
        Wc = torch.softmax(self.conv(x), dim=-1).reshape(b, h, m_c, S)
        return (1.0 - lam) * E + lam * Wc

    def forward(self, keys: torch.Tensor, values: torch.Tensor, scores: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Compress L > M cached tokens to M slots.

        Args:
            keys: K ∈ R^{b×h×L×d}, already rotated (RoPE at absolute positions).
            values: V ∈ R^{b×h×L×d}.
            scores: s ∈ R^{b×h×L}, attention mass received from the last chunk's queries.

        Returns:
            (K', V', idx): K', V' ∈ R^{b×h×M×d} = [heavy hitters ; fused slots] and idx ∈ Z^{b×h×M}, the cache
            index of each heavy hitter (fused slots: −1).
        """
        b, h, L, d = keys.shape
        if d != self.head_dim:
            raise ValueError(f"{OWNER}: keys have head dim {d} but the compressor was built for head_dim="
                             f"{self.head_dim}")
        if L <= self.budget:
            raise ValueError(f"{OWNER}: compress needs more than budget={self.budget} tokens, got {L}")
        keys, values, scores = keys.detach(), values.detach(), scores.detach()  # gradient: current chunk only
        ell = self.local_len
        if ell:  # repo partition_past_key_values: top-(m_hh − ℓ) outside the last ℓ tokens, plus those ℓ
            top = torch.topk(scores[..., : L - ell], self.m_hh - ell, dim=-1).indices
            local = torch.arange(L - ell, L, device=scores.device).expand(b, h, ell)
            hh = torch.cat([top, local], dim=-1).sort(dim=-1).values  # [b,h,m_hh], position order
        else:
            hh = torch.topk(scores, self.m_hh, dim=-1).indices.sort(dim=-1).values  # [b,h,m_hh], position order
        mask = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, hh, True)
        rest = torch.sort(mask.to(torch.int8), dim=-1, stable=True).indices[..., : L - self.m_hh]
        g = lambda t, i: t.gather(2, i.unsqueeze(-1).expand(*i.shape, t.shape[-1]))  # noqa: E731
        k_hh, v_hh = g(keys, hh), g(values, hh)
        if self.m_c == 0:
            return k_hh, v_hh, hh
        k_r, v_r, s_r = g(keys, rest), g(values, rest), scores.gather(2, rest)
        W = self.weights(k_r, v_r, s_r)
        k_f, v_f = W @ k_r, W @ v_r
        idx = torch.cat([hh, torch.full((b, h, self.m_c), -1, dtype=hh.dtype, device=hh.device)], dim=-1)
        return torch.cat([k_hh, k_f], dim=2), torch.cat([v_hh, v_f], dim=2), idx


# ---------------------------------------------------------------------------------------------- eviction rules
def streaming_keep(length: int, budget: int, n_sink: int) -> torch.Tensor:
    """StreamingLLM: cache indices of the first ``n_sink`` tokens and the most recent ``budget − n_sink``."""
    M = v.integer(OWNER, "budget", budget, minimum=1)
    n_sink = v.integer(OWNER, "n_sink", n_sink, minimum=0, maximum=M)
    if length <= M:
        return torch.arange(length)
    return torch.cat([torch.arange(n_sink), torch.arange(length - (M - n_sink), length)])


def h2o_keep(scores: torch.Tensor, budget: int, recent: int) -> torch.Tensor:
    """H2O: per head, the ``budget − recent`` highest-score tokens outside the last ``recent`` plus those ``recent``.

    Args:
        scores: s ∈ R^{b×h×L} (attention received; from the last chunk or accumulated).
    Returns:
        kept cache indices ∈ Z^{b×h×M} in position order.
    """
    M = v.integer(OWNER, "budget", budget, minimum=1)
    recent = v.integer(OWNER, "recent", recent, minimum=0, maximum=M)
    b, h, L = scores.shape
    if L <= M:
        return torch.arange(L, device=scores.device).expand(b, h, L)
    tail = torch.arange(L - recent, L, device=scores.device).expand(b, h, recent)
    head = torch.topk(scores[..., : L - recent], M - recent, dim=-1).indices
    return torch.cat([head, tail], dim=-1).sort(dim=-1).values


def tova_keep(last_query_scores: torch.Tensor, budget: int, per_head: bool = False) -> torch.Tensor:
    """TOVA: keep the ``budget`` tokens with the highest attention from the last query (head-averaged by default).

    Args:
        last_query_scores: a ∈ R^{b×h×L}, the last query's attention probabilities.
    Returns:
        kept cache indices ∈ Z^{b×h×M} in position order.
    """
    M = v.integer(OWNER, "budget", budget, minimum=1)
    b, h, L = last_query_scores.shape
    if L <= M:
        return torch.arange(L, device=last_query_scores.device).expand(b, h, L)
    a = last_query_scores if per_head else last_query_scores.mean(dim=1, keepdim=True).expand(b, h, L)
    return torch.topk(a, M, dim=-1).indices.sort(dim=-1).values
