"""LoRA+ (Hayou, Ghosh, Yu; ICML 2024, arXiv 2402.12354): LoRA with η_B = λ·η_A.

Public API::

    from icml24.loraplus import apply_lora, create_loraplus_optimizer
    model = apply_lora(model, target_modules=["q_proj", "v_proj"], r=8, alpha=16)
    opt = create_loraplus_optimizer(model, optimizer_cls=torch.optim.AdamW, lr=2e-4, loraplus_lr_ratio=16)
"""

from icml24.loraplus.lora import LoRALinear, apply_lora, lora_parameter_names
from icml24.loraplus.optimizer import GROUP_ORDER, create_loraplus_optimizer, loraplus_param_groups
from icml24.loraplus.toy import toy_feature_updates

__all__ = ["LoRALinear", "apply_lora", "lora_parameter_names", "create_loraplus_optimizer", "loraplus_param_groups",
           "GROUP_ORDER", "toy_feature_updates"]
