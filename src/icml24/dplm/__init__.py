"""DPLM: diffusion protein language models (Wang et al., ICML 2024, arXiv 2402.18567).

Absorbing discrete diffusion on an ESM-style masked LM: training objective, the official reparameterised
iterative decoder, motif scaffolding, classifier guidance, and a synthetic protein grammar with exact
likelihoods for evaluation.
"""

from icml24.dplm.diffusion import DiffusionProteinLM, diffusion_loss, loss_weight, mlm_inputs, q_sample
from icml24.dplm.grammar import MOTIF, SS_CLASSES, ProteinGrammar
from icml24.dplm.guidance import StructureGuidance, train_structure_head
from icml24.dplm.models import build_esm, residue_features
from icml24.dplm.sampler import generate, generate_autoregressive, masked_init, reparam_decode, scaffold_init
from icml24.dplm.tokens import AMINO_ACIDS, decode, encode
from icml24.dplm.train import train_lm

__all__ = ["AMINO_ACIDS", "MOTIF", "SS_CLASSES", "DiffusionProteinLM", "ProteinGrammar", "StructureGuidance",
           "build_esm", "decode", "diffusion_loss", "encode", "generate",
           "generate_autoregressive", "loss_weight", "masked_init", "mlm_inputs", "q_sample", "reparam_decode",
           "residue_features", "scaffold_init", "train_lm", "train_structure_head"]
