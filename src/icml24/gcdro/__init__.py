"""GCDRO — Geometry-Calibrated DRO (Liu et al., ICML 2024, arXiv 2311.05054): public API."""

from icml24.gcdro import matched
from icml24.gcdro.core import (
    EdgeList,
    adaptive_step,
    chemical_potential,
    chi2_constrained_worst_case,
    chi2_worst_case,
    cvar_worst_case,
    dirichlet_energy,
    erm_weights,
    gcdro_objective,
    gradient_flow,
    graph_laplacian,
    kl_constrained_worst_case,
    kl_worst_case,
    knn_edges,
    knn_graph,
    laplacian_apply,
    tv_from_uniform,
    upwind_flux,
)
from icml24.gcdro.estimator import GCDROREGRESSOR_SKIPS, DRORegressor, GCDRORegressor
from icml24.gcdro.simulate import corrupt_labels, selection_bias_regression, subpopulation_regression
from icml24.gcdro.weighter import GCDROWeighter

__all__ = [
    "GCDRORegressor",
    "DRORegressor",
    "GCDROWeighter",
    "GCDROREGRESSOR_SKIPS",
    "EdgeList",
    "knn_edges",
    "knn_graph",
    "graph_laplacian",
    "laplacian_apply",
    "dirichlet_energy",
    "gcdro_objective",
    "chemical_potential",
    "upwind_flux",
    "adaptive_step",
    "gradient_flow",
    "erm_weights",
    "kl_worst_case",
    "chi2_worst_case",
    "cvar_worst_case",
    "kl_constrained_worst_case",
    "chi2_constrained_worst_case",
    "tv_from_uniform",
    "matched",
    "selection_bias_regression",
    "subpopulation_regression",
    "corrupt_labels",
]
