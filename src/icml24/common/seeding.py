"""Seeding: one call for the global generators, explicit generators for everything that draws."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from icml24.common import validate


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's global generators (all devices)."""
    validate.integer("seed_everything", "seed", seed, minimum=0)
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
