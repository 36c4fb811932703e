"""dp_public: Optimal Differentially Private Model Training with Public Data (Lowy et al., ICML 2024).

Semi-DP (only the private samples are protected) mean estimation in the central and local models, and
semi-DP SGD mixing noisy clipped private gradients with public gradients. See README.md in this folder.
"""

from icml24.dp_public.mean_estimation import (
    PrivUnitGParams,
    central_mse,
    central_variances,
    gaussian_noise_std,
    ldp_mse,
    ldp_treat_as_private_mean,
    ldp_weighted_mean,
    optimal_public_weight,
    private_only_mean,
    privunitg,
    privunitg_mse,
    privunitg_params,
    project_to_unit_ball,
    throw_away_mean,
    treat_as_private_mean,
    weighted_mean,
)
from icml24.dp_public.semi_dp import (
    SemiDPSGD,
    TrainResult,
    clip_and_sum,
    epsilon_for,
    inverse_variance_beta,
    make_dp_sgd,
    make_public_only_sgd,
    noise_multiplier_for,
    per_sample_grads,
    poisson_sample,
    train_semi_dp,
)

__all__ = [
    "PrivUnitGParams",
    "central_mse",
    "central_variances",
    "gaussian_noise_std",
    "ldp_mse",
    "ldp_treat_as_private_mean",
    "ldp_weighted_mean",
    "optimal_public_weight",
    "private_only_mean",
    "privunitg",
    "privunitg_mse",
    "privunitg_params",
    "project_to_unit_ball",
    "throw_away_mean",
    "treat_as_private_mean",
    "weighted_mean",
    "SemiDPSGD",
    "TrainResult",
    "clip_and_sum",
    "epsilon_for",
    "inverse_variance_beta",
    "make_dp_sgd",
    "make_public_only_sgd",
    "noise_multiplier_for",
    "per_sample_grads",
    "poisson_sample",
    "train_semi_dp",
]
