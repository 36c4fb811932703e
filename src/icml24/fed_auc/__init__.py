"""Federated multi-level compositional minimax for deep AUC maximisation (Zhang et al., ICML 2024).

Public API: the AUC-M and compositional losses, the client update (method and baselines on one code path), the
in-process simulator and the torch.distributed back end, and the imbalanced non-IID tasks.
"""

from icml24.fed_auc.algorithm import OBJECTIVES, FederatedCompositionalAUC
from icml24.fed_auc.backends import (
    SimulationResult,
    average_states,
    run_distributed,
    simulate,
    validate_clients,
)
from icml24.fed_auc.data import TASKS, BinaryTask, dirichlet_split, load_task
from icml24.fed_auc.losses import (
    aucm_loss,
    aucm_optimal_ab,
    aucm_optimal_alpha,
    bce_on_logits,
    compositional_auc_objective,
    inner_ce_map,
)

__all__ = ["FederatedCompositionalAUC", "OBJECTIVES", "simulate", "run_distributed", "average_states",
           "validate_clients", "SimulationResult", "load_task", "dirichlet_split", "BinaryTask", "TASKS",
           "aucm_loss", "aucm_optimal_ab", "aucm_optimal_alpha", "bce_on_logits", "compositional_auc_objective",
           "inner_ce_map"]
