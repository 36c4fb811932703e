"""What the official-loop ports share (``test_official_loop`` for SimPro, ``test_acr`` for ACR): the toy's
sizes, its data, and an augmentation that records every view so the port can replay them."""

from __future__ import annotations

import torch

from icml24.simpro import GaussianMixtureTier

K, D = 4, 5
COUNTS = [12, 6, 3, 2]


def toy_data(seed: int = 0):
    tier = GaussianMixtureTier(num_classes=K, dim=D, mean_scale=2.0, data_seed=seed)
    g = torch.Generator().manual_seed(seed)
    xl, yl = tier.sample(COUNTS, generator=g)
    xu, _ = tier.sample([3, 6, 12, 24], generator=g)
    return xl, yl, xu


class Recorder:
    """An augmentation that records every view it makes (the reference replays them)."""

    def __init__(self) -> None:
        self.views: list[torch.Tensor] = []

    def __call__(self, x, *, strong, generator):
        out = x + (0.5 if strong else 0.1) * torch.randn(x.shape, generator=generator)
        self.views.append(out.clone())
        return out
