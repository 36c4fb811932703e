"""Information-theoretic analysis of in-context learning (Jeon, Lee, Lei & Van Roy, ICML 2024, arXiv 2401.15530).

The hierarchical Bayesian linear model with closed-form posteriors, the exact split of the Bayes-optimal excess
log-loss into meta-learning and intra-task error, the rank-1 linear-representation variant, Monte Carlo estimators
of each term, and a small in-context transformer.
"""

from icml24.icl_theory.hierarchical import (
    ErrorEstimate,
    HierarchicalLinearModel,
    LinearSample,
    asymptotic_intra_error,
    asymptotic_meta_error,
    bayes_nll,
    dense_information,
    estimate_errors,
    intra_task_error,
    irreducible_error,
    kalman_nll,
    meta_learning_error,
    no_meta_error,
    no_meta_nll,
    oracle_psi_nll,
    psi_posterior,
    true_nll,
)
from icml24.icl_theory.icl import ICLTransformer, TrainResult, gaussian_nll, per_position_nll, train_icl
from icml24.icl_theory.subspace import (
    SubspaceEstimate,
    SubspaceLinearModel,
    estimate_subspace_errors,
    sphere_grid,
    subspace_log_likelihood,
)

__all__ = ["ErrorEstimate", "HierarchicalLinearModel", "LinearSample", "asymptotic_intra_error",
           "asymptotic_meta_error", "bayes_nll", "dense_information", "estimate_errors", "intra_task_error",
           "irreducible_error", "kalman_nll", "meta_learning_error", "no_meta_error", "no_meta_nll",
           "oracle_psi_nll", "psi_posterior", "true_nll", "ICLTransformer", "TrainResult", "gaussian_nll",
           "per_position_nll", "train_icl", "SubspaceEstimate", "SubspaceLinearModel", "estimate_subspace_errors",
           "sphere_grid", "subspace_log_likelihood"]
