"""ALH: augmenting TD3 with hypotheses (Quang & Lauw, ICML 2024). See :mod:`icml24.alh.alh`."""

from icml24.alh.alh import ALHAgent, SetMemory, subset_indices
from icml24.alh.envs import Box, MultiNormEnv, make_env
from icml24.alh.runner import evaluate, train
from icml24.alh.td3 import Actor, Critic, ReplayBuffer, TD3Agent, td3_target

__all__ = ["ALHAgent", "SetMemory", "subset_indices", "Box", "MultiNormEnv", "make_env", "evaluate", "train",
           "Actor", "Critic", "ReplayBuffer", "TD3Agent", "td3_target"]
