"""A small Diffuser (Janner et al. 2022, "Planning with Diffusion for Flexible Behavior Synthesis"): DDPM over
state trajectories with start/goal inpainting, the network predicting the clean trajectory x_0.

Forward process (cosine schedule, s = 0.008): q(x_t | x_0) = N(√ᾱ_t x_0, (1 − ᾱ_t) I). Reverse step from the
predicted x̂_0 = f_θ(x_t, t) (clamped to [−1, 1]): the posterior q(x_{t'} | x_t, x̂_0) with t' the previous
timestep of the (possibly strided) schedule; after every step the conditioned states are overwritten:
x[:, 0] = s_start, x[:, H−1] = s_goal (Maze2D GoalDataset). Loss: ‖f_θ(x_t, t) − x_0‖² with x_t inpainted.

Denoisers: :class:`MLPDenoiser` (CPU default) and :class:`TemporalUnet` (the official architecture).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from icml24.common import validate as v

__all__ = ["cosine_beta_schedule", "LimitsNormalizer", "MLPDenoiser", "TemporalUnet", "GaussianDiffusion",
           "train_diffuser"]


def cosine_beta_schedule(n_timesteps: int, s: float = 0.008) -> torch.Tensor:
    """β_t of the cosine schedule (Nichol & Dhariwal), clipped to ≤ 0.999, as Diffuser."""
    steps = n_timesteps + 1
    x = torch.linspace(0, steps, steps, dtype=torch.float64)
    ac = torch.cos(((x / steps) + s) / (1 + s) * math.pi * 0.5) ** 2
    ac = ac / ac[0]
    return torch.clip(1 - (ac[1:] / ac[:-1]), 0, 0.999).float()


class LimitsNormalizer:
    """Per-dimension min/max normalisation to [−1, 1] (Diffuser's maze2d LimitsNormalizer)."""

    def __init__(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=float).reshape(-1, np.asarray(x).shape[-1])
        self.mins, self.maxs = x.min(0), x.max(0)
        self.maxs = np.where(self.maxs - self.mins < 1e-8, self.mins + 1e-8, self.maxs)

    def normalize(self, x: np.ndarray) -> np.ndarray:
        return 2 * (np.asarray(x, dtype=float) - self.mins) / (self.maxs - self.mins) - 1

    def unnormalize(self, x: np.ndarray) -> np.ndarray:
        return (np.clip(np.asarray(x, dtype=float), -1, 1) + 1) / 2 * (self.maxs - self.mins) + self.mins


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        f = torch.exp(torch.arange(half, device=t.device) * -(math.log(10000) / (half - 1)))
        e = t.float()[:, None] * f[None, :]
        return torch.cat([e.sin(), e.cos()], dim=-1)


class MLPDenoiser(nn.Module):
    """x̂_0 = MLP([flatten(x_t), emb(t)]): the CPU default (notes §5: ≈15 ms per training step)."""

    def __init__(self, *, horizon: int, transition_dim: int, hidden: int = 512, depth: int = 3,
                 time_dim: int = 32) -> None:
        super().__init__()
        v.integer("MLPDenoiser", "horizon", horizon, minimum=2)
        v.integer("MLPDenoiser", "transition_dim", transition_dim, minimum=1)
        self.horizon, self.transition_dim = horizon, transition_dim
        self.time = nn.Sequential(SinusoidalPosEmb(time_dim), nn.Linear(time_dim, time_dim * 2), nn.Mish(),
                                  nn.Linear(time_dim * 2, time_dim))
        layers: list[nn.Module] = []
        d = horizon * transition_dim + time_dim
        for _ in range(depth):
            layers += [nn.Linear(d, hidden), nn.Mish()]
            d = hidden
        layers.append(nn.Linear(d, horizon * transition_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        h = torch.cat([x.reshape(b, -1), self.time(t)], dim=-1)
        return self.net(h).reshape(b, self.horizon, self.transition_dim)


class _Conv1dBlock(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, groups: int = 8) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Conv1d(cin, cout, k, padding=k // 2), nn.GroupNorm(groups, cout), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class _ResidualTemporalBlock(nn.Module):
    def __init__(self, cin: int, cout: int, emb_dim: int, k: int = 5) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Conv1dBlock(cin, cout, k), _Conv1dBlock(cout, cout, k)])
        self.time_mlp = nn.Sequential(nn.Mish(), nn.Linear(emb_dim, cout))
        self.residual = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = self.blocks[0](x) + self.time_mlp(t)[:, :, None]
        return self.blocks[1](out) + self.residual(x)


class TemporalUnet(nn.Module):
    """Diffuser's temporal U-Net (official ``diffuser/models/temporal.py`` layout): residual temporal blocks
    (Conv1d k=5, GroupNorm(8), Mish, time embedding added after the first conv), strided-conv down-sampling,
    transposed-conv up-sampling, skip connections. ``horizon`` must be divisible by 2^(len(dim_mults) − 1)."""

    def __init__(self, *, horizon: int, transition_dim: int, dim: int = 32,
                 dim_mults: tuple[int, ...] = (1, 4, 8)) -> None:
        super().__init__()
        v.integer("TemporalUnet", "horizon", horizon, minimum=2)
        v.each("TemporalUnet", "dim_mults", dim_mults, v.integer, minimum=1)
        if horizon % (2 ** (len(dim_mults) - 1)):
            raise ValueError(f"TemporalUnet: horizon ({horizon}) must be divisible by 2^{len(dim_mults) - 1}")
        dims = [transition_dim, *[dim * m for m in dim_mults]]
        io = list(zip(dims[:-1], dims[1:], strict=True))
        self.time_mlp = nn.Sequential(SinusoidalPosEmb(dim), nn.Linear(dim, dim * 4), nn.Mish(),
                                      nn.Linear(dim * 4, dim))
        self.downs, self.ups = nn.ModuleList(), nn.ModuleList()
        n = len(io)
        for k, (a, b) in enumerate(io):
            last = k >= n - 1
            self.downs.append(nn.ModuleList([_ResidualTemporalBlock(a, b, dim), _ResidualTemporalBlock(b, b, dim),
                                             nn.Conv1d(b, b, 3, 2, 1) if not last else nn.Identity()]))
        mid = dims[-1]
        self.mid1, self.mid2 = _ResidualTemporalBlock(mid, mid, dim), _ResidualTemporalBlock(mid, mid, dim)
        for k, (a, b) in enumerate(reversed(io[1:])):
            last = k >= n - 1
            self.ups.append(nn.ModuleList([_ResidualTemporalBlock(b * 2, a, dim), _ResidualTemporalBlock(a, a, dim),
                                           nn.ConvTranspose1d(a, a, 4, 2, 1) if not last else nn.Identity()]))
        self.final = nn.Sequential(_Conv1dBlock(dim, dim, 5), nn.Conv1d(dim, transition_dim, 1))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        te = self.time_mlp(t)
        skips = []
        for r1, r2, down in self.downs:
            x = r2(r1(x, te), te)
            skips.append(x)
            x = down(x)
        x = self.mid2(self.mid1(x, te), te)
        for r1, r2, up in self.ups:
            x = torch.cat([x, skips.pop()], dim=1)
            x = up(r2(r1(x, te), te))
        return self.final(x).transpose(1, 2)


class GaussianDiffusion(nn.Module):
    """DDPM over trajectories ``[B, H, D]`` (normalised states) predicting x_0, with inpainting conditions.

    Args:
        model: denoiser ``f(x_t [B, H, D], t [B]) -> x̂_0``.
        horizon: H; transition_dim: D; n_timesteps: T (Diffuser maze2d: 64-256; CPU default 20).
        clip_denoised: clamp x̂_0 to [−1, 1] (Diffuser maze2d).
    """

    def __init__(self, model: nn.Module, *, horizon: int, transition_dim: int, n_timesteps: int = 20,
                 clip_denoised: bool = True) -> None:
        super().__init__()
        self.model = model
        self.horizon = v.integer("GaussianDiffusion", "horizon", horizon, minimum=2)
        self.transition_dim = v.integer("GaussianDiffusion", "transition_dim", transition_dim, minimum=1)
        self.n_timesteps = v.integer("GaussianDiffusion", "n_timesteps", n_timesteps, minimum=1)
        self.clip_denoised = clip_denoised
        betas = cosine_beta_schedule(n_timesteps)
        self.register_buffer("alphas_cumprod", torch.cumprod(1 - betas, 0))

    @staticmethod
    def apply_conditioning(x: torch.Tensor, cond: dict[int, torch.Tensor]) -> torch.Tensor:
        """x[:, i] = cond[i] for every conditioned index i (inpainting)."""
        for i, s in cond.items():
            x[:, i] = s
        return x

    def loss(self, x0: torch.Tensor, cond: dict[int, torch.Tensor], *, generator: torch.Generator | None = None
             ) -> torch.Tensor:
        """‖f(x_t, t) − x_0‖² averaged, t ~ U{0..T−1}, x_t inpainted with ``cond``."""
        b = x0.shape[0]
        t = torch.randint(0, self.n_timesteps, (b,), device=x0.device, generator=generator)
        noise = torch.randn(x0.shape, device=x0.device, generator=generator)
        ab = self.alphas_cumprod[t][:, None, None]
        xt = self.apply_conditioning(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, cond)
        x0_hat = self.apply_conditioning(self.model(xt, t), cond)
        return ((x0_hat - x0) ** 2).mean()

    def timesteps(self, n_steps: int | None = None) -> list[int]:
        """Decreasing timesteps used by the sampler: all T, or ``n_steps`` evenly strided ones ending at 0."""
        if n_steps is None or n_steps >= self.n_timesteps:
            return list(range(self.n_timesteps - 1, -1, -1))
        v.integer("GaussianDiffusion", "n_steps", n_steps, minimum=1)
        ts = np.unique(np.round(np.linspace(0, self.n_timesteps - 1, n_steps)).astype(int))
        return [int(t) for t in ts[::-1]]

    @torch.no_grad()
    def sample(self, cond: dict[int, torch.Tensor], *, batch_size: int, n_steps: int | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """Ancestral sampling of ``batch_size`` trajectories; ``n_steps`` < T uses a strided schedule (the
        posterior between non-consecutive timesteps, "respaced" DDPM).

        Args:
            cond: {index: normalised state [D] or [B, D]}, e.g. {0: start, H−1: goal}.
        """
        v.integer("GaussianDiffusion", "batch_size", batch_size, minimum=1)
        dev = self.alphas_cumprod.device
        for i, s in cond.items():
            if not -self.horizon <= i < self.horizon:
                raise ValueError(f"GaussianDiffusion: condition index {i} outside the horizon {self.horizon}")
            if s.shape[-1] != self.transition_dim:
                raise ValueError(f"GaussianDiffusion: condition {i} has dimension {s.shape[-1]}, expected "
                                 f"{self.transition_dim}")
        x = torch.randn((batch_size, self.horizon, self.transition_dim), device=dev, generator=generator)
        x = self.apply_conditioning(x, cond)
        ts = self.timesteps(n_steps)
        ac = self.alphas_cumprod
        for k, t in enumerate(ts):
            tt = torch.full((batch_size,), t, device=dev, dtype=torch.long)
            x0 = self.model(x, tt)
            if self.clip_denoised:
                x0 = x0.clamp(-1, 1)
            if k == len(ts) - 1:
                x = x0
            else:
                tp = ts[k + 1]
                ab_t, ab_p = ac[t], ac[tp]
                beta = 1 - ab_t / ab_p                     # β of the (respaced) step t → tp
                c0 = ab_p.sqrt() * beta / (1 - ab_t)
                ct = (1 - beta).sqrt() * (1 - ab_p) / (1 - ab_t)
                var = beta * (1 - ab_p) / (1 - ab_t)
                noise = torch.randn(x.shape, device=dev, generator=generator)
                x = c0 * x0 + ct * x + var.clamp_min(1e-20).sqrt() * noise
            x = self.apply_conditioning(x, cond)
        return x


def train_diffuser(diffusion: GaussianDiffusion, windows: Callable[[int, torch.Generator], torch.Tensor], *,
                   steps: int, batch_size: int = 64, lr: float = 1e-3, ema_decay: float = 0.995,
                   generator: torch.Generator | None = None, progress: Callable | None = None,
                   goal_conditioned: bool = True,
                   on_step: Callable[[int, GaussianDiffusion], None] | None = None
                   ) -> tuple[GaussianDiffusion, list[float]]:
    """Adam on the x_0 loss with start (and goal) inpainting; returns (EMA copy of the model, loss curve).

    Args:
        windows: ``(batch_size, generator) -> [B, H, D]`` normalised training windows.
        steps: optimiser steps; lr: Adam lr (Diffuser 2e-4; 1e-3 here for a short CPU budget); ema_decay: 0.995.
        on_step: called as ``on_step(steps_done, ema)`` after every step (e.g. to evaluate snapshots).
    """
    v.integer("train_diffuser", "steps", steps, minimum=1)
    v.integer("train_diffuser", "batch_size", batch_size, minimum=1)
    v.positive("train_diffuser", "lr", lr)
    v.probability("train_diffuser", "ema_decay", ema_decay)
    ema = copy.deepcopy(diffusion).eval()
    opt = torch.optim.Adam(diffusion.model.parameters(), lr=lr)
    curve = []
    it = range(steps) if progress is None else progress(range(steps))
    for _ in it:
        x0 = windows(batch_size, generator)
        cond = {0: x0[:, 0]}
        if goal_conditioned:
            cond[diffusion.horizon - 1] = x0[:, -1]
        loss = diffusion.loss(x0, cond, generator=generator)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            for pe, p in zip(ema.model.parameters(), diffusion.model.parameters(), strict=True):
                pe.lerp_(p, 1 - ema_decay)
        curve.append(float(loss.detach()))
        if on_step is not None:
            on_step(len(curve), ema)
    return ema, curve
