"""Bayesian online planning (Greshler et al., ICML 2024, arXiv 2406.02103): TSTS, BTS and the N-MCTS baseline.

Example::

    from icml24.bayes_mcts import GridMaze, SimulatedValueModel, TSTS, run_episode
    env = GridMaze(size=4, seed=0)
    net = SimulatedValueModel(q_star=env.q_star, sigma_err=1.0, std_mode="gt", seed=0)
    ep = run_episode(env=env, planner=TSTS(env=env, value_model=net, budget=20), max_steps=60)
"""

from icml24.bayes_mcts.distributions import (
    MIN_VAR,
    bts_percentile,
    gaussian_quantile,
    linear_transform,
    max_of_gaussians,
    max_of_gaussians_mc,
    max_of_two_gaussians,
)
from icml24.bayes_mcts.envs import (
    GridLeaper,
    GridMaze,
    GymnasiumAdapter,
    MiniGridAdapter,
    PlanningEnv,
    brute_force_q,
    check_env,
    fog_mask,
    make_minigrid,
)
from icml24.bayes_mcts.planners import (
    BTS,
    NMCTS,
    PLANNERS,
    TSTS,
    EpisodeResult,
    GreedyPlanner,
    Node,
    SearchResult,
    TreeSearchPlanner,
    make_planner,
    run_episode,
)
from icml24.bayes_mcts.value_models import (
    STD_MODES,
    BinnedResidualStd,
    EstimatedStdModel,
    SimulatedValueModel,
    ValueModel,
    check_value_output,
    validation_residuals,
)

__all__ = [
    "MIN_VAR", "bts_percentile", "gaussian_quantile", "linear_transform", "max_of_gaussians",
    "max_of_gaussians_mc", "max_of_two_gaussians",
    "GridLeaper", "GridMaze", "GymnasiumAdapter", "MiniGridAdapter", "PlanningEnv", "brute_force_q", "check_env",
    "fog_mask", "make_minigrid",
    "BTS", "NMCTS", "PLANNERS", "TSTS", "EpisodeResult", "GreedyPlanner", "Node", "SearchResult",
    "TreeSearchPlanner", "make_planner", "run_episode",
    "STD_MODES", "SimulatedValueModel", "ValueModel", "check_value_output", "BinnedResidualStd", "EstimatedStdModel",
    "validation_residuals",
]
