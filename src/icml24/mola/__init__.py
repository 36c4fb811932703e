"""MoLA: Mixture of Low-rank Adapters for training on heterogeneous data (Zhou et al., ICML 2024).

arXiv 2406.09679 · official code https://github.com/MediaBrain-SJTU/MoLA. See ``README.md`` in this folder.
"""

from icml24.mola.layers import GateContext, MoLAConv2d, MoLALinear, MoLAModel, Router, TaskGate, apply_mola
from icml24.mola.twd import twd_loss

__all__ = ["GateContext", "MoLALinear", "MoLAConv2d", "TaskGate", "Router", "MoLAModel", "apply_mola", "twd_loss"]
