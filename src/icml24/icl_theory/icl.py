"""A small causal transformer that learns in context on sequences of the hierarchical linear model.

Token t holds the query z_t and the previous pair (z_{t−1}, y_{t−1}), embedded by one Linear(2d+1→h), plus a learned
position embedding; causal attention lets token t read every earlier pair. At token t the network outputs a Gaussian
(μ_t, ln σ_t²) for y_t, trained with the Gaussian negative log-likelihood in nats: the log-loss of the theory, comparable token for token
with the Bayes predictor. ``context=False`` zeroes the previous pair and restricts attention to the token itself, so
the same network sees only z_t and no earlier (z, y) pair: it cannot learn in context (the negative control).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from icml24.common import validate as v

__all__ = ["ICLTransformer", "TrainResult", "gaussian_nll", "train_icl", "per_position_nll"]

_OWNER = "icl_theory"


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, n, w = x.shape
        q, k, val = self.qkv(self.ln1(x)).view(B, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, val, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(B, n, w))
        return x + self.mlp(self.ln2(x))


class ICLTransformer(nn.Module):
    """Pre-norm causal transformer with a Gaussian head; token t carries (z_t, z_{t−1}, y_{t−1}).

    Args:
        d: input dimension.  T: maximum sequence length.  width: h.  depth: layers.  heads: attention heads.
        context: False zeroes the previous pair in every token and masks every other token (the model sees only
            z_t when predicting y_t).
    """

    # NOTE(deviation): notes §5.3 interleave z_t and y_t as 2T tokens; one token per position holding the query
    # z_t and the previous pair (z_{t−1}, y_{t−1}) carries the same information under a causal mask with T tokens,
    # which halves the CPU cost.
    def __init__(self, *, d: int, T: int, width: int = 32, depth: int = 2, heads: int = 4,
                 context: bool = True) -> None:
        super().__init__()
        v.integer(_OWNER, "d", d, minimum=1)
        v.integer(_OWNER, "T", T, minimum=1)
        v.integer(_OWNER, "width", width, minimum=1)
        v.integer(_OWNER, "depth", depth, minimum=1)
        v.integer(_OWNER, "heads", heads, minimum=1)
        if width % heads:
            raise ValueError(f"{_OWNER}: width ({width}) must be divisible by heads ({heads})")
        self.d, self.T, self.context = d, T, bool(context)
        self.embed = nn.Linear(2 * d + 1, width)
        self.pos = nn.Parameter(0.02 * torch.randn(T, width))
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 2)
        allowed = torch.tril(torch.ones(T, T, dtype=torch.bool)) if self.context else torch.eye(T, dtype=torch.bool)
        self.register_buffer("mask", allowed, persistent=False)  # True = may attend

    def tokens(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(B, T, 2d+1) tokens [z_t, z_{t−1}, y_{t−1}] (zeros for t = 1, and everywhere without context)."""
        prev = torch.cat([z, y[..., None]], -1)
        prev = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], 1)
        if not self.context:
            prev = torch.zeros_like(prev)
        return torch.cat([z, prev], -1)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z: (B, T, d), y: (B, T) → (μ, ln σ²), each (B, T): the prediction of y_t from (z, y)_{<t} and z_t."""
        T = z.shape[1]
        if T > self.T:
            raise ValueError(f"{_OWNER}: sequence length {T} exceeds the model's T={self.T}")
        h = self.embed(self.tokens(z, y)) + self.pos[:T]
        for blk in self.blocks:
            h = blk(h, self.mask[:T, :T])
        out = self.head(self.norm(h))
        return out[..., 0], out[..., 1].clamp(-9.0, 9.0)


def gaussian_nll(mu: torch.Tensor, log_var: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """−ln N(y; μ, σ²) per element, in nats."""
    return 0.5 * (math.log(2 * math.pi) + log_var + (y - mu) ** 2 * torch.exp(-log_var))


@dataclass
class TrainResult:
    model: ICLTransformer
    best_step: int
    val_curve: list[tuple[int, float]]


def _as_tensors(Z: np.ndarray, Y: np.ndarray, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.as_tensor(Z, dtype=torch.float32, device=device),
            torch.as_tensor(Y, dtype=torch.float32, device=device))


@torch.no_grad()
def per_position_nll(model: ICLTransformer, *, Z: np.ndarray, Y: np.ndarray, batch_size: int = 512,
                     device: str | torch.device = "cpu") -> np.ndarray:
    """Mean NLL (nats) of y_t at each position t = 1..T over the sequences Z (N, T, d), Y (N, T): shape (T,)."""
    model.eval()
    z, y = _as_tensors(Z, Y, device)
    tot = torch.zeros(z.shape[1], dtype=torch.float64, device=device)
    for i in range(0, z.shape[0], batch_size):
        mu, lv = model(z[i:i + batch_size], y[i:i + batch_size])
        tot += gaussian_nll(mu, lv, y[i:i + batch_size]).double().sum(0)
    return (tot / z.shape[0]).cpu().numpy()


def train_icl(*, Z: np.ndarray, Y: np.ndarray, Z_val: np.ndarray, Y_val: np.ndarray, context: bool, steps: int,
              batch_size: int = 32, lr: float = 1e-3, weight_decay: float = 0.0, eval_every: int = 200,
              width: int = 32, depth: int = 2, heads: int = 4, seed: int = 0,
              device: str | torch.device = "cpu") -> TrainResult:
    """Train on the M pretraining sequences Z (M, T, d), Y (M, T) with AdamW (cosine schedule, short warm-up);
    the returned model is the checkpoint with the lowest validation NLL (evaluated at step 0 and every
    ``eval_every`` steps)."""
    if Z.ndim != 3 or Y.shape != Z.shape[:2]:
        raise ValueError(f"{_OWNER}: Z must be (M, T, d) and Y (M, T), got {Z.shape} and {Y.shape}")
    steps = v.integer(_OWNER, "steps", steps, minimum=1)
    batch_size = v.integer(_OWNER, "batch_size", batch_size, minimum=1)
    eval_every = v.integer(_OWNER, "eval_every", eval_every, minimum=1)
    v.positive(_OWNER, "lr", lr)
    M, T, d = Z.shape
    torch.manual_seed(seed)
    model = ICLTransformer(d=d, T=T, width=width, depth=depth, heads=heads, context=context).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    z, y = _as_tensors(Z, Y, device)
    gen = torch.Generator().manual_seed(10_000 + seed)
    best = float(per_position_nll(model, Z=Z_val, Y=Y_val, device=device).mean())  # step 0 is a checkpoint too
    best_step, best_state, curve = 0, copy.deepcopy(model.state_dict()), [(0, best)]
    for step in range(1, steps + 1):
        model.train()
        idx = torch.randint(0, M, (batch_size,), generator=gen).to(device)
        mu, lv = model(z[idx], y[idx])
        loss = gaussian_nll(mu, lv, y[idx]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % eval_every == 0 or step == steps:
            val = float(per_position_nll(model, Z=Z_val, Y=Y_val, device=device).mean())
            curve.append((step, val))
            if val < best:
                best, best_step, best_state = val, step, copy.deepcopy(model.state_dict())
    model.load_state_dict(best_state)
    model.eval()
    return TrainResult(model=model, best_step=best_step, val_curve=curve)
