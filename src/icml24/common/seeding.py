"""Seeding: one call for the global generators, explicit generators for everything that draws."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's global generators (all devices)."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def torch_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed``."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def numpy_generator(seed: int) -> np.random.Generator:
    """A NumPy ``Generator`` (PCG64) seeded with ``seed``."""
    return np.random.default_rng(seed)
