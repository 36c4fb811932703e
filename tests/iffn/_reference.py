"""Slow explicit-loop reference shared by the IFFN tests."""

from __future__ import annotations

import torch


def dwconv_at(u: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, bi: int, t: int, p: int, side: int
              ) -> torch.Tensor:
    """Depthwise k×k convolution (zero padding) of the patch-token grid of ``u[bi]`` at token ``t >= p``."""
    k = w.shape[-1]
    r = k // 2
    i, j = divmod(t - p, side)
    s = bias.clone()
    for di in range(k):
        for dj in range(k):
            ii, jj = i + di - r, j + dj - r
            if 0 <= ii < side and 0 <= jj < side:
                s = s + w[:, di, dj] * u[bi, p + ii * side + jj]
    return s
