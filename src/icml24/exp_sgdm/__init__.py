"""Exp-SGDM: SGD with momentum and Exp(1) random update scaling (Zhang & Cutkosky, ICML 2024, arXiv 2405.09742)."""

from icml24.exp_sgdm.optimizer import ExpSGDM
from icml24.exp_sgdm.synthetic import (
    IdentityEstimate,
    NonsmoothObjective,
    scaling_identity_gap,
    stationarity_upper_bound,
)
from icml24.exp_sgdm.wrapper import RandomScaling

__all__ = ["ExpSGDM", "IdentityEstimate", "NonsmoothObjective", "RandomScaling", "scaling_identity_gap",
           "stationarity_upper_bound"]
