"""TAT: Trajectory Aggregation Tree over a Diffuser planner (arXiv 2405.17879), in a numpy point-mass maze."""

from icml24.tat.diffuser import (
    GaussianDiffusion,
    LimitsNormalizer,
    MLPDenoiser,
    TemporalUnet,
    cosine_beta_schedule,
    train_diffuser,
)
from icml24.tat.maze import (
    LAYOUTS,
    MAZE_NAMES,
    Maze,
    MazeDataset,
    PointMaze2D,
    collect_dataset,
    expert_return,
    plan_infeasible,
    segments_cross_walls,
)
from icml24.tat.planner import DiffuserPlanner, EpisodeResult, execute_plan, execute_plans
from icml24.tat.policy import TATPlanner
from icml24.tat.tree import (
    TrajectoryAggregationTree,
    TreeNode,
    aggregate_plan,
    forward_state,
    medoid_index,
    reverse_state,
)

__all__ = ["TrajectoryAggregationTree", "TreeNode", "aggregate_plan", "medoid_index", "TATPlanner", "forward_state",
           "reverse_state", "Maze", "PointMaze2D",
           "MazeDataset", "collect_dataset", "plan_infeasible", "segments_cross_walls", "expert_return", "LAYOUTS",
           "MAZE_NAMES", "GaussianDiffusion", "MLPDenoiser", "TemporalUnet", "LimitsNormalizer",
           "cosine_beta_schedule", "train_diffuser", "DiffuserPlanner", "EpisodeResult", "execute_plan",
           "execute_plans"]
