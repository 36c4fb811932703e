"""NExT-GPT: Any-to-Any Multimodal LLM (arXiv 2309.05519): encoders -> input projection -> LLM (+LoRA) ->
signal tokens -> output projectors -> diffusion decoders, with the paper's three training stages."""

from icml24.next_gpt.components import (
    DiffusionDecoder,
    FrozenConfig,
    JointEncoder,
    Oracle,
    WordTokenizer,
    load_or_train_frozen,
    train_frozen,
    train_frozen_shell,
)
from icml24.next_gpt.model import (
    Generation,
    LoRAConv1D,
    LoRALinear,
    Media,
    NExTGPT,
    NExTGPTConfig,
    OutputProjector,
    StageConfig,
    l2_loss,
    module_hash,
    train_stage,
)

__all__ = ["DiffusionDecoder", "FrozenConfig", "Generation", "JointEncoder", "LoRAConv1D", "LoRALinear", "Media",
           "NExTGPT", "NExTGPTConfig", "Oracle", "OutputProjector", "StageConfig", "WordTokenizer", "l2_loss",
           "load_or_train_frozen", "module_hash", "train_frozen", "train_frozen_shell", "train_stage"]
