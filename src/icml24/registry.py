"""The 19 papers: metadata for all, experiments imported lazily (``icml24.<slug>.experiment``).

``icml24 list`` works without any extra installed: only metadata is read here. A paper is *implemented*
when its experiment module exists.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Paper:
    slug: str
    title: str
    arxiv: str | None
    code: str | None
    claim: str

    @property
    def module(self) -> str:
        return f"icml24.{self.slug}.experiment"

    @property
    def implemented(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except ModuleNotFoundError:
            return False

    @property
    def status(self) -> str:
        return "implemented" if self.implemented else "planned"


_P = Paper
PAPERS: dict[str, Paper] = {p.slug: p for p in [
    _P("loraplus", "LoRA+: Efficient Low Rank Adaptation of Large Models", "2402.12354",
       "nikhil-ghosh-berkeley/loraplus",
       "Setting the LoRA B matrix's learning rate lambda times higher than A's (lambda >> 1, growing with width) "
       "gives lower loss and up to ~2x faster fine-tuning than LoRA at equal cost."),
    _P("exp_sgdm", "Random Scaling and Momentum for Non-smooth Non-convex Optimization", "2405.09742", None,
       "SGD with momentum whose update is scaled by an Exp(1) random variable is optimal for non-smooth "
       "non-convex optimisation and performs on par with SGDM in practice."),
    _P("mola", "Exploring Training on Heterogeneous Data with Mixture of Low-rank Adapters", "2406.09679",
       "MediaBrain-SJTU/MoLA",
       "A mixture of low-rank adapters (task-routed or learned-routed, with task-wise decorrelation) beats a "
       "shared backbone on heterogeneous multi-domain data."),
    _P("kd_ranking", "Revisit the Essence of Distilling Knowledge through Calibration", None, None,
       "Teacher calibration, not accuracy, drives KL distillation; a ranking-based loss that ignores the "
       "teacher's confidence scale makes distillation insensitive to miscalibrated teachers."),
    _P("gcdro", "Geometry-Calibrated DRO: Combating Over-Pessimism with Free Energy Implications", "2311.05054",
       None,
       "Calibrating the DRO uncertainty set with the data geometry (a graph Laplacian term in a free energy) "
       "avoids over-pessimism on noisy points and improves out-of-distribution regression."),
    _P("private_density", "Privately Learning Smooth Distributions on the Hypercube by Projections", "2409.10083",
       None,
       "Private projection estimators attain the minimax rate over Sobolev classes, and a private Lepskii "
       "procedure adapts to unknown smoothness at the price of a log factor."),
    _P("dp_public", "Optimal Differentially Private Model Training with Public Data", "2306.15056",
       "optimization-for-data-driven-science/DP-with-public-data",
       "Optimally weighting public and private data beats both discarding the private data and treating public "
       "data as private, in mean estimation and DP training."),
    _P("fed_auc", "A Federated Stochastic Multi-Level Compositional Minimax Algorithm for Deep AUC Maximization",
       None, None,
       "A federated multi-level compositional minimax algorithm maximises AUC under class imbalance with "
       "communication-efficient local updates."),
    _P("spikezip_tf", "SpikeZIP-TF: Conversion is All You Need for Transformer-based SNN", "2406.03470",
       "Intelligent-Computing-Research-Group/SpikeZIP_transformer",
       "Converting a quantized ReLU transformer to a spiking one with signed ST-BIF neurons and "
       "spike-equivalent operators is exact: the SNN reproduces the quantized ANN's outputs."),
    _P("iffn", "Enhancing Vision Transformer: Amplifying Non-Linearity in Feedforward Network Module", None, None,
       "Amplifying the FFN's non-linearity (AGeLU instances and a spatial branch) lets a ViT use a much smaller "
       "hidden ratio at equal or better accuracy, saving FLOPs."),
    _P("lococo", "LoCoCo: Dropping In Convolutions for Long Context Compression", "2406.05317",
       "VITA-Group/LoCoCo",
       "Fusing old KV entries into a fixed-size cache with learned 1-D convolutions keeps long-context quality "
       "far better than dropping tokens at the same cache size."),
    _P("traveling_waves", "Hidden Traveling Waves bind Working Memory Variables in Recurrent Neural Networks",
       "2402.10163", None,
       "Working memory in RNNs can be stored as traveling waves of activity that bind variables, and trained "
       "RNNs converge to such wave solutions."),
    _P("alh", "Augmenting Decision with Hypothesis in Reinforcement Learning", None, "nbtpj/ALH",
       "Augmenting actor-critic decisions with hypotheses recalled from a memory improves sample efficiency "
       "over TD3/DDPG on continuous control."),
    _P("tat", "Resisting Stochastic Risks in Diffusion Planners with the Trajectory Aggregation Tree",
       "2405.17879", "langfengQ/tree-diffusion-planner",
       "Aggregating sampled diffusion-planner trajectories in a tree and acting on its most supported branch "
       "avoids unreliable plans, improving returns without retraining."),
    _P("bayes_mcts", "A Bayesian Approach to Online Planning", "2406.02103", "nirgreshler/bayesian-online-planning",
       "Treating the neural value and policy estimates as uncertain (Bayesian MCTS with Thompson sampling or "
       "Bayes-UCB) plans better than PUCT when the networks are inaccurate."),
    _P("simpro", "SimPro: A Simple Probabilistic Framework Towards Realistic Long-Tailed Semi-Supervised Learning",
       "2402.13505", "LeapLabTHU/SimPro",
       "An EM model that separately estimates the unknown unlabeled class prior handles any unlabeled "
       "distribution in long-tailed semi-supervised learning."),
    _P("dplm", "Diffusion Language Models Are Versatile Protein Learners", "2402.18567", "bytedance/dplm",
       "A discrete (absorbing) diffusion protein language model learns representations and generates "
       "sequences better than masked and autoregressive language models."),
    _P("next_gpt", "NExT-GPT: Any-to-Any Multimodal LLM", "2309.05519", "NExT-GPT/NExT-GPT",
       "Connecting an LLM to modality encoders and diffusion decoders through small trained projection "
       "layers yields any-to-any multimodal generation at low tuning cost."),
    _P("icl_theory", "An Information-Theoretic Analysis of In-Context Learning", "2401.15530", None,
       "In-context learning error decomposes into irreducible, meta-learning and intra-task terms that decay "
       "with the number of pre-training sequences and the sequence length."),
]}


def get(slug: str) -> Paper:
    """The paper for ``slug``; ``KeyError`` listing the valid slugs otherwise."""
    try:
        return PAPERS[slug]
    except KeyError:
        raise KeyError(f"unknown paper {slug!r}; valid: {', '.join(PAPERS)}") from None


def experiment(slug: str) -> ModuleType:
    """Import and return ``icml24.<slug>.experiment`` (with ``Config`` and ``run``)."""
    paper = get(slug)
    if not paper.implemented:
        raise LookupError(f"{slug} is planned, not implemented yet")
    return importlib.import_module(paper.module)
