"""Revisit the Essence of Distilling Knowledge through Calibration (Fan et al., ICML 2024).

Calibration metrics (ECE with over/under-confidence parts, NLL, Brier), temperature scaling, vanilla
KL distillation and calibration-insensitive ranking-based distillation losses, and a small ``distill`` loop.
"""

from icml24.kd_ranking.calibration import CalibrationMetrics, ece, fit_temperature
from icml24.kd_ranking.losses import (
    AUTO_TOP_K,
    AUTO_TOP_K_ABOVE,
    RANKING_KINDS,
    KLDistillLoss,
    RankingKDLoss,
    distill,
)

__all__ = ["CalibrationMetrics", "ece", "fit_temperature", "KLDistillLoss", "RankingKDLoss", "RANKING_KINDS",
           "AUTO_TOP_K", "AUTO_TOP_K_ABOVE", "distill"]
